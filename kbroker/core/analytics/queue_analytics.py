"""Stale-message analytics and dialog reclassification as pure state (docs/analytics.md): the
analytics job feeds it what Spark read and asks it what to write. No I/O; the clock is the input's.

Arrivals come from the queue topics, receive progress from the worker's snapshots of each queue
group's committed offsets (`committed` plus the `completed` offsets above it: kbroker's readers
complete out of order). A message is unreceived from its arrival until a snapshot covers it. The
job's clock (`now`) is the newest snapshot or record time seen, so a batch applied twice to the
same state gives the same numbers.

A record is known by its (partition, offset), never by where its timestamp puts it: several
producers SENDing to one partition append records whose timestamps do not rise with their offsets,
and the job feeds a batch in timestamp order. A batch holds, per partition, offsets above every
earlier batch's, so a record is one seen already when its offset is at or below the highest of an
earlier batch (`top`, moved up by `report`) or taken in this batch (`fresh`).
"""

from __future__ import annotations

import heapq
from typing import Any

from kbroker.core.analytics.analytics_model import Arrival, Dialog, Output, Partition, Progress, Window
from kbroker.core.analytics.dialog_class import STALE, DialogFacts, classify
from kbroker.core.dialogs.retained import NEVER_DELIVERED

STALE_THRESHOLDS = (("dispatcher_10s", 10.0), ("forwarder_60s", 60.0))  # docs/sources.md#periodic-tasks
ERROR_TYPE = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
KEEP_WINDOWS = 120  # per queue, windows kept after they close, so a late record still adds up
FORGET_IDLE_MS = 3600_000  # an idle dialog with nothing pending is forgotten after an hour


class Analytics:
    def __init__(self, namespace: str, *, window_s: float = 60.0, stale_after_s: float = 30.0, top: int = 5):
        self.namespace, self.window_ms, self.default_stale, self.top = (
            namespace,
            int(window_s * 1000),
            stale_after_s,
            top,
        )
        self.now = 0
        self.stale_after: dict[str, float] = {}  # queue -> its catalog threshold
        self._parts: dict[tuple[str, int], Partition] = {}
        self._windows: dict[tuple[str, int], Window] = {}
        self._dialogs: dict[str, Dialog] = {}
        self._timers: dict[str, str] = {}  # timer key -> dialog
        self._touched: set[tuple[str, int]] = set()  # windows changed since the last report

    # --- input ---------------------------------------------------------------------------------

    def arrival(self, a: Arrival) -> None:
        self.now = max(self.now, a.ts)
        part = self._parts.setdefault((a.queue, a.partition), Partition())
        if a.offset <= part.top or a.offset in part.fresh:
            return  # seen already
        part.fresh.add(a.offset)
        if a.message_type in NEVER_DELIVERED:  # not a message that arrived
            return
        dialog_key = f"{a.conversation_id}/{a.side}"
        ts, counted, old = a.ts, True, None
        if a.rekeyed_from:  # MOVE CONVERSATION's copy: the same message, now under another group
            counted = False
            p, _, o = a.rekeyed_from.partition(":")
            origin = self._parts.get((a.queue, int(p))) if p.isdigit() and o.isdigit() else None
            old = origin.pending.pop(int(o), None) if origin is not None else None
            if old is not None:
                ts = old[0]
                self._dialog(old[2], a.queue).pending -= 1
        d = self._dialog(dialog_key, a.queue)
        d.group = a.group
        if counted:
            self._window(a.queue, a.ts).arrivals += 1
            d.last_arrival = max(d.last_arrival or 0, a.ts)
            if a.message_type == ERROR_TYPE:
                d.last_error = max(d.last_error or 0, a.ts)
        if part.received(a.offset):  # the snapshot ran ahead of Spark's read of the queue
            if counted or old is not None:  # a copy's receive is its pending original's
                self._receive(a.queue, d, self.now)
            return
        part.pending[a.offset] = [ts, a.group, dialog_key]
        d.pending += 1

    def progress(self, p: Progress) -> None:
        self.now = max(self.now, p.at)
        for partition, committed, completed in p.partitions:
            part = self._parts.setdefault((p.queue, partition), Partition())
            part.committed, part.completed = max(part.committed, committed), set(completed)
            done = [o for o in part.pending if part.received(o)]
            for offset in done:
                _, _, dialog_key = part.pending.pop(offset)
                d = self._dialog(dialog_key, p.queue)
                d.pending -= 1
                self._receive(p.queue, d, p.at)

    def dead_lettered(self, queue: str, conversation_id: str, side: str, ts: int) -> None:
        self.now = max(self.now, ts)
        d = self._dialog(f"{conversation_id}/{side}", queue)
        d.last_error = max(d.last_error or 0, ts)

    def timer(self, key: str, armed: tuple[str, str, str] | None) -> None:
        """A timers-topic record: `armed` = (queue, conversation_id, side), or None for a tombstone."""
        old = self._timers.pop(key, None)
        if old is not None and old in self._dialogs:
            self._dialogs[old].timers -= 1
        if armed is not None:
            queue, conv, side = armed
            dialog_key = self._timers[key] = f"{conv}/{side}"
            self._dialog(dialog_key, queue).timers += 1

    def _receive(self, queue: str, d: Dialog, at: int) -> None:
        """Counted in the window of `at`: the time of the snapshot that showed it received."""
        self._window(queue, at).receives += 1
        d.last_receive = max(d.last_receive or 0, at)

    def _window(self, queue: str, ts: int) -> Window:
        key = (queue, ts - ts % self.window_ms)
        self._touched.add(key)
        return self._windows.setdefault(key, Window())

    def _dialog(self, key: str, queue: str) -> Dialog:
        d = self._dialogs.get(key)
        if d is None:
            d = self._dialogs[key] = Dialog(queue=queue)
        d.seen = self.now
        return d

    # --- output --------------------------------------------------------------------------------

    def report(self, batch: int) -> Output:
        """The records this batch calls for: every queue's current window (its gauges measured
        now), windows whose counts changed, dialogs whose class changed (and stale ones whose oldest
        unreceived message or backlog did), windows that closed."""
        out = Output()
        for part in self._parts.values():  # the batch ends: what it took is below `top` from now on
            if part.fresh:
                part.top = max(part.top, *part.fresh)
                part.fresh.clear()
        now = self.now
        if now == 0:
            return out
        queues = sorted({q for q, _ in self._parts} | {q for q, _ in self._windows})
        gauges, oldest_of = self._gauges(queues)
        for q in queues:
            self._window(q, now).gauges = gauges[q]
        for key in sorted(self._touched):
            q, start = key
            w = self._windows[key]
            out.analytics.append((f"queue/{q}/{start}", self._row(q, start, w, batch)))
            w.closed = False
        # A window closes one window after its end, in a batch that did not change it (a job
        # catching up still adds to old windows); a record later still reopens it.
        for key in sorted(k for k in self._windows if k[1] + 2 * self.window_ms <= now and k not in self._touched):
            w = self._windows[key]
            if not w.closed:
                w.closed = True
                out.closed.append(self._row(key[0], key[1], w, batch))
        self._touched.clear()
        for q in queues:
            starts = sorted(s for (wq, s) in self._windows if wq == q)
            for start in starts[:-KEEP_WINDOWS]:
                del self._windows[(q, start)]
        self._classify(batch, oldest_of, out)
        return out

    def _gauges(self, queues: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
        """Per queue: backlog, oldest age, stale counts, top groups; and each dialog's oldest
        unreceived timestamp. One pass over what is unreceived."""
        now = self.now
        per_queue: dict[str, dict[str, Any]] = {}
        oldest_of: dict[str, int] = {}
        for q in queues:
            stale_after = self.stale_after.get(q, self.default_stale)
            limits = [(name, now - int(s * 1000)) for name, s in STALE_THRESHOLDS] + [
                ("queue", now - int(stale_after * 1000))
            ]
            stale = dict.fromkeys((name for name, _ in limits), 0)
            backlog, oldest = 0, None
            groups: dict[str, list[int]] = {}  # group -> [count, oldest ts]
            for (pq, _), part in self._parts.items():
                if pq != q:
                    continue
                for ts, group, dialog_key in part.pending.values():
                    backlog += 1
                    oldest = ts if oldest is None else min(oldest, ts)
                    for name, limit in limits:
                        if ts <= limit:
                            stale[name] += 1
                    g = groups.setdefault(group, [0, ts])
                    g[0] += 1
                    g[1] = min(g[1], ts)
                    if ts < oldest_of.get(dialog_key, ts + 1):
                        oldest_of[dialog_key] = ts
            top = heapq.nsmallest(self.top, groups.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))
            per_queue[q] = {
                "backlog": backlog,
                "oldest_unreceived_age_s": None if oldest is None else round(max(0, now - oldest) / 1000, 3),
                "stale": stale,
                "stale_after_s": stale_after,
                "top_groups": [
                    {"group": g, "backlog": n, "oldest_age_s": round(max(0, now - ts) / 1000, 3)} for g, (n, ts) in top
                ],
            }
        return per_queue, oldest_of

    def _row(self, queue: str, start: int, w: Window, batch: int) -> dict[str, Any]:
        empty: dict[str, Any] = {
            "backlog": 0,
            "oldest_unreceived_age_s": None,
            "stale": {n: 0 for n, _ in STALE_THRESHOLDS} | {"queue": 0},
            "stale_after_s": self.stale_after.get(queue, self.default_stale),
            "top_groups": [],
        }
        return {
            "kind": "queue_window",
            "namespace": self.namespace,
            "queue": queue,
            "window_start": start,
            "window_end": start + self.window_ms,
            "window_s": self.window_ms / 1000,
            "arrivals": w.arrivals,
            "receives": w.receives,
            **(w.gauges or empty),
            "as_of": self.now,
            "batch": batch,
        }

    def _classify(self, batch: int, oldest_of: dict[str, int], out: Output) -> None:
        for key in sorted(self._dialogs):
            d = self._dialogs[key]
            facts = DialogFacts(
                now_ms=self.now,
                window_s=self.window_ms / 1000,
                stale_after_s=self.stale_after.get(d.queue, self.default_stale),
                backlog=d.pending,
                oldest_ms=oldest_of.get(key),
                last_arrival_ms=d.last_arrival,
                last_receive_ms=d.last_receive,
                last_error_ms=d.last_error,
                timers=d.timers,
            )
            klass, reason = classify(facts)
            # Forgotten only once its idle class was reported (a clock that jumps past the hour in
            # one batch must still tell the worker the dialog went idle).
            if klass == d.klass == "idle" and d.pending <= 0 and d.timers <= 0 and self.now - d.seen >= FORGET_IDLE_MS:
                del self._dialogs[key]
                continue
            # A record per change of class, with its command; a stale dialog's record is also
            # rewritten when its oldest unreceived message or its backlog changes, so the timestamp
            # a view ages it from is its oldest unreceived message's now (docs/analytics.md).
            shown = [facts.oldest_ms, d.pending]
            changed = klass != d.klass
            if not changed and (klass != STALE or shown == d.shown):
                continue
            conv, _, side = key.rpartition("/")
            if changed:
                d.previous, d.klass = d.klass, klass
            d.shown = shown
            age = None if facts.oldest_ms is None else round((self.now - facts.oldest_ms) / 1000, 3)
            out.analytics.append(
                (
                    f"dialog/{key}",
                    {
                        "kind": "dialog",
                        "conversation_id": conv,
                        "side": side,
                        "queue": d.queue,
                        "group": d.group,
                        "class": klass,
                        "previous": d.previous,
                        "reason": reason,
                        "backlog": d.pending,
                        "oldest_unreceived": facts.oldest_ms,
                        "oldest_age_s": age,
                        "last_arrival": d.last_arrival,
                        "last_receive": d.last_receive,
                        "errors": d.last_error is not None,
                        "timer_pending": d.timers > 0,
                        "as_of": self.now,
                        "batch": batch,
                    },
                )
            )
            if changed:
                out.commands.append(
                    (
                        key,
                        {
                            "command": "RECLASSIFY",
                            "conversation_id": conv,
                            "side": side,
                            "queue": d.queue,
                            "from": d.previous,
                            "to": klass,
                            "reason": reason,
                            "at": self.now,
                            "batch": batch,
                        },
                    )
                )

    # --- state ---------------------------------------------------------------------------------

    def backlog(self, queue: str) -> int:
        return sum(len(p.pending) for (q, _), p in self._parts.items() if q == queue)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now,
            "parts": [
                [
                    q,
                    p,
                    part.committed,
                    sorted(part.completed),
                    part.top,
                    [[o, *v] for o, v in part.pending.items()],
                    sorted(part.fresh),
                ]
                for (q, p), part in self._parts.items()
            ],
            "windows": [[q, s, w.arrivals, w.receives, w.gauges, w.closed] for (q, s), w in self._windows.items()],
            "dialogs": [
                [
                    k,
                    d.queue,
                    d.group,
                    d.pending,
                    d.last_arrival,
                    d.last_receive,
                    d.last_error,
                    d.timers,
                    d.klass,
                    d.seen,
                    d.previous,
                    d.shown,
                ]
                for k, d in self._dialogs.items()
            ],
            "timers": self._timers,
            "touched": [list(k) for k in self._touched],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], namespace: str, **settings: Any) -> "Analytics":
        a = cls(namespace, **settings)
        a.now = data["now"]
        # no `fresh` in a state saved by an earlier version
        for q, p, committed, completed, top, pending, *fresh in data["parts"]:
            a._parts[(q, p)] = Partition(
                pending={o: [ts, g, dk] for o, ts, g, dk in pending},
                committed=committed,
                completed=set(completed),
                top=top,
                fresh=set(fresh[0]) if fresh else set(),
            )
        for q, s, arrivals, receives, gauges, closed in data["windows"]:
            a._windows[(q, s)] = Window(arrivals, receives, gauges, closed)
        for k, queue, group, pending, la, lr, le, timers, klass, seen, *later in data["dialogs"]:
            # `later`: previous and shown, not in a state saved by an earlier version
            a._dialogs[k] = Dialog(queue, group, pending, la, lr, le, timers, klass, seen, *later)
        a._timers = dict(data["timers"])
        a._touched = {(q, s) for q, s in data["touched"]}
        return a


def dialog_row_at(row: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """A dialog record as a view shows it at `now_ms`: `oldest_age_s` is its oldest unreceived
    message's age now, from the stored timestamp (`oldest_unreceived`; in a record written before
    that field, `as_of` less the age then), not the age when the job wrote the record."""
    oldest = row.get("oldest_unreceived")
    if oldest is None and row.get("oldest_age_s") is not None and row.get("as_of") is not None:
        oldest = round(row["as_of"] - row["oldest_age_s"] * 1000)
    return {**row, "oldest_age_s": None if oldest is None else round(max(0, now_ms - oldest) / 1000, 3)}
