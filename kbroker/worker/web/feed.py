"""The dashboard's snapshots (worker/web/dashboard.py serves them). A snapshot is `{"at": epoch s,
"namespace", "worker", "queues": {queue: {...}}, "tasks": [...], "analytics": {...}, "monitors":
{...}}`; each queue's entry holds `backlog`, `arrivals_per_s`, `receives_per_s`, `stale_10s`,
`stale_60s`, `stale_queue`, `oldest_age_s`, `monitor_state` and `readers`, and a few more (`merge`
below says what each is). It merges three sources:

- the analytics job's queue windows (docs/analytics.md), which an AnalyticsFollower reads as they
  are written. The per-second rates come from the differences between successive copies of a
  queue's windows over the last RATE_SPAN_S seconds of the job's clock (`Rates`), and from the
  newest window's count over its elapsed time until two copies have been seen;
- the queue monitors' rows (`kbroker monitors`): state, readers, and the backlog the leader
  counts for each activated queue (about twice a tick). They are read from the monitor table's
  changelog, a read of the whole topic, so only while someone has asked for the dashboard in
  the last WATCH_GRACE_S seconds, at most once a second;
- this worker's activated readers (task handlers).

One `DashboardFeed` per worker builds the snapshots on a thread of its own, every second, so
neither a slow read nor a broker outage touches the event loop: a failing source is logged once
per outage (and its recovery once), its last data kept, and tried again the next second. The
backlog shown is whichever source measured it last (`backlog_source` says which).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.kafka.analytics.store import AnalyticsFollower

__all__ = ["INTERVAL_S", "MONITOR_TIMEOUT_S", "RATE_SPAN_S", "WATCH_GRACE_S", "DashboardFeed", "Rates", "merge"]

# The dashboard's logger, as before the feed had a module of its own.
log = logging.getLogger("kbroker.worker.web.dashboard")

INTERVAL_S = 1.0  # one snapshot a second
RATE_SPAN_S = 10.0  # per-second rates are averages over this much of the analytics job's clock
WATCH_GRACE_S = 30.0  # monitor rows are read while someone asked for the dashboard this recently
MONITOR_TIMEOUT_S = 3.0  # a monitor-row read gives up after this (a broker outage)


class Rates:
    """Arrivals and receives per second per queue, from successive copies of the analytics job's
    windows. A window is rewritten while it is open, each copy with the counts so far; the
    growth of every kept window of a queue between two copies, over the job's clock between
    them (`as_of`), is the rate. Each time the job's newest `as_of` moves on, every queue gets a
    sample of its running totals (a queue whose windows did not change adds nothing, so its rate
    falls to 0); the rate is taken over the samples of the last `span` seconds."""

    def __init__(self, span: float = RATE_SPAN_S):
        self.span = span
        self.clock: float | None = None  # the newest as_of seen, in epoch seconds
        self._counted: dict[str, dict[int, tuple[int, int]]] = {}  # queue -> window -> (arrivals, receives)
        self._totals: dict[str, tuple[int, int]] = {}
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}

    def update(self, windows: dict[str, list[dict[str, Any]]]) -> None:
        """Take the follower's windows (queue -> its windows, oldest first)."""
        newest = max((w.get("as_of") or 0 for ws in windows.values() for w in ws), default=0) / 1000
        if not newest or (self.clock is not None and newest <= self.clock):
            return
        self.clock = newest
        for queue, ws in windows.items():
            counted = self._counted.setdefault(queue, {})
            arrivals, receives = self._totals.get(queue, (0, 0))
            for w in ws:
                a, r = int(w.get("arrivals") or 0), int(w.get("receives") or 0)
                was_a, was_r = counted.get(w["window_start"], (0, 0))
                arrivals, receives = arrivals + a - was_a, receives + r - was_r
                counted[w["window_start"]] = (a, r)
            kept = {w["window_start"] for w in ws}
            for start in [k for k in counted if k not in kept]:  # dropped by the follower
                del counted[start]
            self._totals[queue] = (arrivals, receives)
            samples = self._samples.setdefault(queue, deque())
            samples.append((newest, arrivals, receives))
            while len(samples) > 2 and samples[1][0] <= newest - self.span:
                samples.popleft()

    def rates(self, queue: str) -> tuple[float, float] | None:
        """(arrivals, receives) per second, or None before two samples of the queue."""
        samples = self._samples.get(queue)
        if not samples or len(samples) < 2:
            return None
        (t0, a0, r0), (t1, a1, r1) = samples[0], samples[-1]
        if t1 <= t0:
            return None
        return (a1 - a0) / (t1 - t0), (r1 - r0) / (t1 - t0)


def _epoch(iso: str | None) -> float | None:
    try:
        return None if iso is None else datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def merge(
    catalog_queues: list[str],
    latest: dict[str, dict[str, Any]],
    rates: Rates,
    monitors: list[dict[str, Any]] | None,
    tasks: list[dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """queue -> its dashboard entry, for every queue of the catalog, the analytics windows and
    the monitor rows. `latest` is each queue's newest window; None where a source says nothing:

    backlog         unreceived messages: the analytics window's or the monitor's count, whichever
                    was measured last (`backlog_source`: "analytics" or "monitor")
    arrivals_per_s, receives_per_s   from `rates`, else the newest window's counts over its elapsed time
    stale_10s, stale_60s, stale_queue   unreceived messages older than 10 s, 60 s and the queue's
                    stale_after (`stale_after_s`), at the window's `analytics_as_of` (epoch ms)
    oldest_age_s    the oldest unreceived message's age at `analytics_as_of`
    monitor_state, readers, max_readers, activation, ready_groups, degraded   the monitor's row
    tasks           this worker's activated readers of the queue
    """
    rows = {r["queue"]: r for r in monitors or []}
    running: dict[str, int] = {}
    for t in tasks:
        running[t["queue"]] = running.get(t["queue"], 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for queue in sorted(set(catalog_queues) | set(latest) | set(rows)):
        w, row = latest.get(queue), rows.get(queue)
        entry: dict[str, Any] = {
            "backlog": None,
            "backlog_source": None,
            "arrivals_per_s": None,
            "receives_per_s": None,
            "stale_10s": None,
            "stale_60s": None,
            "stale_queue": None,
            "stale_after_s": None,
            "oldest_age_s": None,
            "analytics_as_of": None,
            "window_start": None,
            "monitor_state": None,
            "readers": None,
            "max_readers": None,
            "activation": None,
            "ready_groups": None,
            "monitor_as_of": None,
            "degraded": None,
            "tasks": running.get(queue, 0),
        }
        backlog_at = None
        if w is not None:
            stale = w.get("stale") or {}
            as_of = w.get("as_of")
            entry.update(
                backlog=w.get("backlog"),
                backlog_source="analytics",
                stale_10s=stale.get("dispatcher_10s"),
                stale_60s=stale.get("forwarder_60s"),
                stale_queue=stale.get("queue"),
                stale_after_s=w.get("stale_after_s"),
                oldest_age_s=w.get("oldest_unreceived_age_s"),
                analytics_as_of=as_of,
                window_start=w.get("window_start"),
            )
            backlog_at = None if as_of is None else as_of / 1000
            got = rates.rates(queue)
            if got is None and as_of is not None and w.get("window_start") is not None:
                elapsed = min(float(w.get("window_s") or 60), max(1.0, (as_of - w["window_start"]) / 1000))
                got = (int(w.get("arrivals") or 0) / elapsed, int(w.get("receives") or 0) / elapsed)
            if got is not None:
                entry["arrivals_per_s"], entry["receives_per_s"] = _round(got[0]), _round(got[1])
        if row is not None:
            counted = _epoch(row.get("as_of"))
            entry.update(
                monitor_state=row.get("state"),
                readers=row.get("readers"),
                max_readers=row.get("max_queue_readers"),
                activation=row.get("activation"),
                ready_groups=row.get("ready_groups"),
                monitor_as_of=counted,
                degraded=row.get("degraded"),
            )
            if row.get("backlog") is not None and counted is not None and (backlog_at is None or counted > backlog_at):
                entry.update(backlog=row["backlog"], backlog_source="monitor")
        out[queue] = entry
    return out


class DashboardFeed:
    """The worker's snapshots, built every `interval` seconds on a thread of their own."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        worker_id: str,
        broker: Any,
        handlers: Any,
        interval: float = INTERVAL_S,
        follower: Callable[[Cluster, str], Any] = AnalyticsFollower,
        monitors: Callable[..., list[dict[str, Any]]] | None = None,
    ):
        self.cluster, self.namespace, self.worker_id = Cluster.of(cluster), namespace, worker_id
        self._broker, self._handlers, self._interval = broker, handlers, interval
        self._new_follower, self._monitor_rows = follower, monitors  # monitors: views.monitor_rows
        self._rates = Rates()
        self._follower: Any = None
        self._follower_lock = threading.Lock()  # poll() and close() never overlap
        self._monitors: list[dict[str, Any]] | None = None
        self._monitors_at: float | None = None
        self._watched = -WATCH_GRACE_S  # monotonic time someone last asked for the dashboard
        self._failing: dict[str, str] = {}  # source -> the error logged when it started failing
        self._stop = threading.Event()
        self._built = threading.Condition()
        self._built_at = -1.0  # monotonic start of the step that built the current snapshot
        self._snapshot: dict[str, Any] = self._empty()
        self._thread: threading.Thread | None = None

    def _empty(self) -> dict[str, Any]:
        return {
            "at": time.time(),
            "namespace": self.namespace,
            "worker": self.worker_id,
            "queues": {},
            "tasks": [],
            "analytics": {"as_of": None, "error": None},
            "monitors": {"as_of": None, "error": None},
        }

    def start(self) -> DashboardFeed:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kbroker-dashboard", daemon=True)
            self._thread.start()
        return self

    def watch(self) -> None:
        """Someone looks at the dashboard: read the monitor rows for the next WATCH_GRACE_S."""
        self._watched = time.monotonic()

    def watched(self) -> bool:
        return time.monotonic() - self._watched < WATCH_GRACE_S

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot

    def fresh_snapshot(self, timeout: float = 5.0) -> dict[str, Any]:
        """A snapshot with the monitor rows in it: the current one while the dashboard is being
        watched (they are read every second then), else the first one built after this call."""
        was_watched = self.watched()
        asked = time.monotonic()
        self.watch()
        if not was_watched:
            with self._built:
                self._built.wait_for(lambda: self._built_at >= asked or self._stop.is_set(), timeout)
        return self._snapshot

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.step(started)
            except Exception as exc:  # noqa: BLE001 - the feed never dies: logged, and tried again
                self._failed("snapshot", exc)
            self._stop.wait(max(0.05, self._interval - (time.monotonic() - started)))

    def step(self, started: float | None = None) -> dict[str, Any]:
        """Read what is new and build the next snapshot."""
        started = time.monotonic() if started is None else started
        at = time.time()  # the snapshot's time: when its reads began, a second after the last one's
        latest = self._poll_analytics()
        if self.watched():
            self._read_monitors()
        try:
            catalog = list(self._broker.catalog.queues)
            self._ok("catalog")
        except Exception as exc:  # noqa: BLE001 - a broker outage before the first catalog read
            self._failed("catalog", exc)
            catalog = []
        tasks = sorted(self._handlers.rows(), key=lambda t: (t["queue"], t["started_at"] or 0))
        now = time.time()
        clock = self._rates.clock
        snap = {
            "at": round(at, 3),
            "namespace": self.namespace,
            "worker": self.worker_id,
            "queues": merge(catalog, latest, self._rates, self._monitors, tasks),
            "tasks": tasks,
            "analytics": {
                "as_of": None if clock is None else int(clock * 1000),
                "age_s": None if clock is None else _round(max(0.0, now - clock), 1),
                "error": self._failing.get("analytics"),
            },
            "monitors": {"as_of": self._monitors_at, "error": self._failing.get("monitors"), "read": self.watched()},
        }
        with self._built:
            self._snapshot, self._built_at = snap, started
            self._built.notify_all()
        return snap

    def _poll_analytics(self) -> dict[str, dict[str, Any]]:
        with self._follower_lock:
            if self._stop.is_set():
                return {}
            try:
                if self._follower is None:
                    self._follower = self._new_follower(self.cluster, self.namespace)
                for _ in range(20):  # catching up: up to 20,000 records a step
                    if self._follower.poll(timeout=0.2) < 1000:
                        break
                self._ok("analytics")
            except Exception as exc:  # noqa: BLE001 - an outage: logged once, polled again next second
                self._failed("analytics", exc)
            if self._follower is None:
                return {}
            windows = self._follower.queues()
        self._rates.update(windows)
        return {q: ws[-1] for q, ws in windows.items() if ws}

    def _read_monitors(self) -> None:
        if self._monitor_rows is None:
            from kbroker.worker.web.views import monitor_rows

            self._monitor_rows = monitor_rows
        try:
            self._monitors = self._monitor_rows(self.cluster, self.namespace, timeout=MONITOR_TIMEOUT_S)
            self._monitors_at = time.time()
            self._ok("monitors")
        except Exception as exc:  # noqa: BLE001 - an outage: the last rows stay, read again next second
            self._failed("monitors", exc)

    def _failed(self, source: str, exc: Exception) -> None:
        if source not in self._failing:
            log.warning(
                "dashboard: reading %s failed (%s: %s); trying again every second, the last data kept",
                source,
                type(exc).__name__,
                exc,
            )
        self._failing[source] = f"{type(exc).__name__}: {exc}"

    def _ok(self, source: str) -> None:
        if self._failing.pop(source, None) is not None:
            log.info("dashboard: reading %s works again", source)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._built:
            self._built.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._follower_lock.acquire(timeout=timeout):
            try:
                if self._follower is not None:
                    self._follower.close()
                    self._follower = None
            finally:
                self._follower_lock.release()
