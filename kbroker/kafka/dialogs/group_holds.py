"""The conversation group holds of this process (core/dialogs/group_hold.py says what the records
mean): the holds its statements claim on groups another process reads, and the grants it gives,
as a partition's owner, to other processes' claims. One thread follows the holds topic: it folds
every record, grants claims once no transaction here holds the group (locking it in the receiver
for the holder), renews and releases this process's holds and owner records, and asks for a
group back (`want`) when the receiver has records for it or a transaction here waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.group_hold import (
    HOLD_SECONDS,
    IDLE_RELEASE,
    MARGIN,
    RENEW_WITHIN,
    GroupKey,
    Hold,
    HoldBook,
    HoldRecord,
    PartitionKey,
)
from kbroker.core.dialogs.group_lock import ConversationGroupLockTimeoutError
from kbroker.core.dialogs.send_lease import YIELD_BACKOFF
from kbroker.errors import BrokerUnavailableError
from kbroker.kafka.background import Background
from kbroker.kafka.dialogs.hold_state import GroupReader, Mine, Owned, RemoteHolder
from kbroker.kafka.dialogs.hold_topic import HoldTopic

log = logging.getLogger("kbroker.holds")

IO_SECONDS = 10.0  # the bound on reading and writing the holds topic for one hold
KEEP_EVERY = 0.25  # seconds between the keeper's passes
OWN_RENEW = 2.5  # seconds between an owner record's renewals


class GroupHolds(Background):
    thread_name = "kbroker-holds"

    def __init__(
        self, cluster: ClusterLike, namespace: str, process: str, catch_up: Callable[[float], None] | None = None
    ):
        """`catch_up(timeout)`: reads what other processes' transactions wrote (the endpoints
        topic), raising where it cannot; run before a group another process held is handed
        out again here, since that process's transaction may have moved or ended the group's
        conversations and the records must be sorted by what it wrote."""
        super().__init__()
        self._catch_up = catch_up
        self._cluster, self.namespace, self.process = Cluster.of(cluster), namespace, process
        self._book = HoldBook()
        self._cv = threading.Condition()  # guards the book, _mine, _owned and the topic's position
        self._topic = HoldTopic(self._cluster, namespace, self._cv)
        self.topic = self._topic.topic
        self._mine: dict[GroupKey, Mine] = {}
        # Holds let go to a waiting process lately (monotonic time): taken back here only after
        # YIELD_BACKOFF, or the releasing process, first to read its own release, won every turn.
        self._yielded: dict[GroupKey, float] = {}
        self._owned: dict[tuple[str, str | None], Owned] = {}
        self._started = threading.Lock()
        self._running = False
        self._noted = False

    # --- starting -----------------------------------------------------------------------------

    def ensure_started(self, timeout: float = 10.0) -> None:
        """Start following the topic (creating it where an older namespace lacks it)."""
        with self._started:
            if self._running:
                return
            self._topic.start(timeout)
            self._running = True
            self.start()

    # --- the follower ---------------------------------------------------------------------------

    def _run(self) -> None:
        kept = 0.0
        while not self._stop.is_set():
            try:
                msgs = self._topic.read()
            except Exception as exc:  # noqa: BLE001 - an outage: logged once, read on
                self._note(f"cannot read {self.topic}: {exc}")
                time.sleep(0.5)
                continue
            if msgs:
                self._fold(msgs)
            if msgs or time.monotonic() - kept >= KEEP_EVERY or any(o.pending for o in list(self._owned.values())):
                kept = time.monotonic()
                try:
                    self._keep()
                except Exception as exc:  # noqa: BLE001 - an outage: logged once, kept trying
                    self._note(f"cannot keep group holds: {exc}")

    def _note(self, why: str) -> None:
        if not self._noted:  # an outage is logged once
            self._noted = True
            log.warning("%s", why)

    def _fold(self, msgs: list[tuple[int, HoldRecord | None]]) -> None:
        with self._cv:
            for offset, rec in msgs:
                self._topic.moved(offset)
                if rec is None:
                    continue
                self._book.fold(rec)
                if rec.kind == "want" and rec.group is not None:
                    mine = self._mine.get(rec.group_key)
                    if mine is not None and mine.epoch == rec.epoch and rec.by != self.process:
                        mine.wanted = True  # the keeper releases it once no transaction holds it
            self._cv.notify_all()

    def _keep(self) -> None:
        """Renew and release this process's holds and owner records, grant the claims on groups
        of owned partitions, and keep the groups held for others locked."""
        now, mono = time.time(), time.monotonic()
        out: list[HoldRecord] = []
        with self._cv:
            for key, m in list(self._mine.items()):
                h = self._book.hold(key)
                if h is None or h.epoch != m.epoch or h.holder != self.process:
                    if m.in_use == 0:
                        del self._mine[key]  # taken over: nothing to renew or release
                    continue
                if m.in_use == 0 and (m.wanted or mono - m.used >= IDLE_RELEASE):
                    del self._mine[key]
                    if m.wanted:
                        self._yielded[key] = mono
                    out.append(self._record("release", key, m.partition, now, epoch=m.epoch))
                elif m.until - now < RENEW_WITHIN:
                    m.until = now + HOLD_SECONDS
                    out.append(self._record("renew", key, m.partition, now, epoch=m.epoch, until=m.until))
            for key in [k for k, at in self._yielded.items() if mono - at >= YIELD_BACKOFF]:
                del self._yielded[key]
            owned = list(self._owned.items())
            for (queue, instance), o in owned:
                if mono - o.renewed >= OWN_RENEW:
                    o.renewed = mono
                    for p, epoch in o.partitions.items():
                        out.append(
                            HoldRecord(
                                "own", queue, instance, p, self.process, now, epoch=epoch, until=now + HOLD_SECONDS
                            )
                        )
        for qk, o in owned:
            with o.lock:
                out.extend(self._reconcile(qk, o, now))
        self._write(out)

    def _reconcile(self, qk: tuple[str, str | None], o: Owned, now: float) -> list[HoldRecord]:
        """For one receiver: lock the groups others hold (reserved, where a transaction here holds
        one, until it ends), grant the claims once their group is locked, ask for held groups
        back, and let go of the holds that ended. The receiver is called without this object's
        lock held."""
        with self._cv:
            live: dict[str, Hold] = {}
            for (queue, instance, group), h in self._book.holds.items():
                if (queue, instance) == qk and h.partition in o.partitions and h.holder != self.process:
                    if h.live(now - MARGIN):
                        live[group] = h
        out: list[HoldRecord] = []
        queue, instance = qk
        ended = [
            (group, holder)
            for group, holder in o.holders.items()
            if (still := live.get(group)) is None or still.epoch != holder.epoch or still.holder != holder.process
        ]
        retry = False
        if ended and self._catch_up is not None:
            try:
                self._catch_up(IO_SECONDS)
            except Exception as exc:  # noqa: BLE001 - an outage: the groups stay locked, tried again
                self._note(f"cannot read what the holders of released groups wrote: {exc}")
                ended, retry = [], True
        for group, holder in ended:
            del o.holders[group]
            o.reader.unreserve(holder.lease)
            o.reader.release(holder.lease, False)
        pending = False
        for group, h in live.items():
            known = o.holders.get(group)
            if known is None:
                holder = RemoteHolder(h.holder, h.epoch, h.partition)
                holder.lease, holder.locked = o.reader.reserve_group(holder, group)
                o.holders[group] = holder
            else:
                holder = known
                if not holder.locked:
                    holder.locked = o.reader.holds(holder.lease)
            if not holder.locked:
                pending = True
                continue
            if not h.granted and not holder.granted:
                holder.granted = True
                out.append(
                    HoldRecord(
                        "grant", queue, instance, h.partition, self.process, now,
                        group=group, epoch=h.epoch, to=h.holder, until=now + HOLD_SECONDS,
                    )
                )  # fmt: skip
            elif not holder.asked and (holder.wanted or o.reader.has_buffered(group)):
                holder.asked = True
                out.append(
                    HoldRecord("want", queue, instance, h.partition, self.process, now, group=group, epoch=h.epoch)
                )
        o.pending = pending or retry
        return out

    def _record(self, kind: str, key: GroupKey, partition: int, now: float, **kw: Any) -> HoldRecord:
        return HoldRecord(kind, key[0], key[1], partition, self.process, now, group=key[2], **kw)

    def _write(self, records: list[HoldRecord], timeout: float = 10.0) -> int:
        return self._topic.write(records, timeout)

    def _write_or_note(self, records: list[HoldRecord], what: str, timeout: float = 2.0) -> None:
        """Records that run out by themselves anyway: an outage is noted, not raised."""
        try:
            if records:
                self._write(records, timeout)
        except ConnectionError as exc:
            self._note(f"cannot {what}: {exc}")

    # --- what statements call --------------------------------------------------------------------

    def partition_for(self, topic: str, group: str, timeout: float) -> int:
        self.ensure_started()
        return self._topic.partition_for(topic, group, timeout)

    def hold(self, key: GroupKey, topic: str, timeout: float, handle: str | None = None) -> None:
        """Return once this process holds `key` (queue, instance, group; `topic` the queue's):
        ConversationGroupLockTimeoutError when another process keeps it past `timeout` s."""
        self.ensure_started()
        deadline = time.monotonic() + timeout
        with self._cv:
            m, h = self._mine.get(key), self._book.hold(key)
            # The log's word, not this process's: a renewal refused (taken over) ends the hold.
            if m is not None and h is not None and h.epoch == m.epoch and h.usable_by(self.process, time.time()):
                m.in_use += 1
                m.used = time.monotonic()
                return
            yielded = self._yielded.pop(key, None)
        if yielded is not None:  # the process it went to gets the first chance to take it
            time.sleep(max(0.0, min(yielded + YIELD_BACKOFF - time.monotonic(), deadline - time.monotonic())))
        queue, instance, group = key
        # The lock time-out counts waiting for another transaction, not for Kafka: reading and
        # writing the holds topic have their own, longer bound (a loaded machine can take longer
        # than a short LOCK_TIMEOUT for one round trip when no one holds the group).
        io_deadline = max(deadline, time.monotonic() + IO_SECONDS)
        partition = self.partition_for(topic, group, max(timeout, IO_SECONDS))
        pk: PartitionKey = (queue, instance, partition)
        fresh = self._topic.catch_up(io_deadline)
        asked = -1
        while True:
            now = time.time()
            out: HoldRecord | None = None
            with self._cv:
                h, o = self._book.hold(key), self._book.owner(pk)
                owner_free = o is None or o.owner == self.process or o.until + MARGIN < now
                contended = not owner_free  # a claim waits for the owner's grant
                if h is not None and h.usable_by(self.process, now):
                    self._mine[key] = Mine(key, partition, h.epoch, h.until, in_use=1)
                    return
                if h is not None and h.holder != self.process and h.live(now):
                    contended = True
                    if asked != h.epoch:
                        asked = h.epoch
                        out = self._record("want", key, partition, now, epoch=h.epoch)
                elif h is not None and h.holder == self.process and not h.granted and h.live(now + MARGIN):
                    if owner_free and fresh:
                        out = self._taking(key, partition, now, h.epoch, o.epoch if o else -1)
                else:
                    epoch = h.epoch + 1 if h is not None else 1
                    if owner_free and fresh:
                        out = self._taking(key, partition, now, epoch, o.epoch if o else -1)
                    elif fresh:
                        out = self._record("claim", key, partition, now, epoch=epoch, until=now + HOLD_SECONDS)
            mono = time.monotonic()
            if (mono >= deadline and contended) or mono >= io_deadline:
                self._give_up(key, partition)
                if contended:
                    raise ConversationGroupLockTimeoutError(group, timeout, handle)
                raise BrokerUnavailableError(f"cannot hold conversation group {group}: {self.topic} does not answer")
            if out is not None:
                offset = self._write([out])
                self._topic.folded_past(offset, io_deadline)
            else:
                with self._cv:
                    self._cv.wait(min(0.05, max(0.0, io_deadline - time.monotonic())))
            if not fresh:
                fresh = self._topic.catch_up(io_deadline)

    def _taking(self, key: GroupKey, partition: int, now: float, epoch: int, over: int) -> HoldRecord:
        return self._record("take", key, partition, now, epoch=epoch, until=now + HOLD_SECONDS, over=over)

    def _give_up(self, key: GroupKey, partition: int) -> None:
        """A claim that timed out is withdrawn, so the owner does not grant it to nobody."""
        with self._cv:
            h = self._book.hold(key)
        if h is not None and h.holder == self.process:
            rec = self._record("release", key, partition, time.time(), epoch=h.epoch)
            self._write_or_note([rec], "withdraw a claim")

    def done(self, key: GroupKey) -> None:
        """A transaction that held `key` ended: released now if another process wants it."""
        release: HoldRecord | None = None
        with self._cv:
            m = self._mine.get(key)
            if m is None:
                return
            m.in_use = max(0, m.in_use - 1)
            m.used = time.monotonic()
            if m.in_use == 0 and m.wanted:
                del self._mine[key]
                self._yielded[key] = time.monotonic()
                release = self._record("release", key, m.partition, time.time(), epoch=m.epoch)
        if release is not None:
            self._write_or_note([release], "release a group hold", timeout=10.0)

    # --- what receivers call --------------------------------------------------------------------

    def owned(self, queue: str, instance: str | None, reader: GroupReader, partitions: list[int]) -> None:
        """A receiver was given `partitions`: own them, and lock what others hold there, before it
        serves them (on its poll thread, before their records are fetched)."""
        self.ensure_started()
        deadline = time.monotonic() + 10.0
        now = time.time()
        self._topic.catch_up(deadline)
        with self._cv:
            o = self._owned.setdefault((queue, instance), Owned(reader))
            o.reader = reader
            out = []
            for p in partitions:
                cur = self._book.owner((queue, instance, p))
                epoch = (cur.epoch if cur is not None else 0) + 1
                o.partitions[p] = epoch
                out.append(
                    HoldRecord("own", queue, instance, p, self.process, now, epoch=epoch, until=now + HOLD_SECONDS)
                )
            o.renewed = time.monotonic()
        offset = self._write(out)
        self._topic.folded_past(offset, deadline)
        self._topic.catch_up(deadline)  # the takes written before this process's record landed
        with o.lock:
            granted = self._reconcile((queue, instance), o, time.time())
        self._write(granted)

    def disowned(self, queue: str, instance: str | None, partitions: list[int]) -> None:
        """A receiver gave `partitions` up: its holders' leases end with them."""
        now = time.time()
        with self._cv:
            o = self._owned.get((queue, instance))
            if o is None:
                return
            out = []
            for p in partitions:
                epoch = o.partitions.pop(p, None)
                if epoch is not None:
                    out.append(HoldRecord("disown", queue, instance, p, self.process, now, epoch=epoch))
            gone = [(g, hd) for g, hd in o.holders.items() if hd.partition in partitions]
        with o.lock:
            for g, hd in gone:
                o.holders.pop(g, None)
                o.reader.unreserve(hd.lease)
                o.reader.release(hd.lease, False)
        self._write_or_note(out, "give up partitions' group holds")  # in the revocation: not long

    def close(self) -> None:
        """Stop, releasing this process's holds and owner records (no one waits them out)."""
        now, out = time.time(), []
        with self._cv:
            for key, m in self._mine.items():
                out.append(self._record("release", key, m.partition, now, epoch=m.epoch))
            for (queue, instance), o in self._owned.items():
                for p, epoch in o.partitions.items():
                    out.append(HoldRecord("disown", queue, instance, p, self.process, now, epoch=epoch))
            self._mine, running = {}, self._running
        super().close()
        if running:
            self._write_or_note(out, "release group holds at close")
        self._topic.close()
