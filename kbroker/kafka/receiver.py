"""RECEIVE on one queue, for every reader of a process: key-level concurrency over one consumer.

A poll thread owns the queue's consumer and only ever buffers records per conversation group, so
a reader that holds a group for minutes never stalls polling. A RECEIVE leases one ready,
unlocked group (highest priority first, then oldest) and takes up to TOP(n) of its messages;
other readers lease other groups of the same partition at the same time. A lease ends when its
transaction commits (offsets complete) or rolls back (its records go back, in order, to the head
of the group). Memory is bounded: past `max_buffered` records the consumer pauses.

On a rebalance, leases on revoked partitions get `revoke_grace` seconds to finish; the rest are
doomed (their commit fails and nothing they did becomes visible), and the revocation waits for
any Kafka transaction already carrying their offsets, so the next owner never overlaps them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka import Message as KafkaRecord

from kbroker.config import KAFKA_LOG
from kbroker.core import names
from kbroker.core.catalog.models import DIALOG_TIMER, ERROR
from kbroker.core.endpoint import handle_for
from kbroker.core.envelope import Envelope, MalformedRecord, Message
from kbroker.core.offsets import PartitionOffsets

log = logging.getLogger("kbroker.receiver")


QUEUED_MAX_KBYTES = 16 * 1024  # librdkafka read-ahead per consumer (see QueueReceiver)
# Service Broker hands a dialog's DialogTimer out before its other messages, then Error, whenever
# they arrived; EndDialog and the rest keep arrival order.
_FIRST = {DIALOG_TIMER: 0, ERROR: 1}


def _head_key(b: "Buffered") -> tuple:
    """RECEIVE order between groups: priority (higher first), then the head record's age."""
    return (-b.envelope.priority, b.record.timestamp()[1], b.record.offset())


def _position(b: "Buffered") -> tuple[int, int]:
    return b.record.partition(), b.record.offset()


def _ready_entry(group: str, q: deque, seq: int) -> tuple:
    """The ready heap's entry of a group: its head's RECEIVE order, then the head's position,
    which tells a stale entry (the head has changed since) from a current one."""
    return (_head_key(q[0]), seq, group, _position(q[0]))


def _blocked(q: deque, full: dict[int, int]) -> bool:
    """A group whose partition hands out only its low-water record, which this group lacks."""
    low = full.get(q[0].record.partition())
    return low is not None and q[0].record.offset() != low and all(b.record.offset() != low for b in q)


def _enqueue(q: deque, b: "Buffered") -> None:
    rank = _FIRST.get(b.envelope.message_type_name)
    if rank is None:
        q.append(b)
        return
    i = 0
    while i < len(q) and _FIRST.get(q[i].envelope.message_type_name, 2) <= rank:
        i += 1
    q.insert(i, b)


@dataclass
class Buffered:
    envelope: Envelope
    record: KafkaRecord


@dataclass(eq=False)
class Lease:
    """The records one transaction took from one conversation group (or dead-lettered)."""

    receiver: "QueueReceiver"
    group: str | None
    owner: Any
    taken: list[Buffered] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) to complete
    doomed: bool = False
    included: bool = False  # carried by a Kafka transaction under way

    @property
    def partitions(self) -> set[int]:
        return {p for p, _ in self.offsets}


class QueueReceiver:
    def __init__(self, bootstrap: str, namespace: str, queue: str, *,
                 dead_letter: Callable[["QueueReceiver", KafkaRecord, str], None],
                 max_buffered: int = 20_000, revoke_grace: float = 5.0,
                 commit_barrier: Callable[[], None] = lambda: None, topic: str | None = None,
                 on_assign: Callable[[], None] = lambda: None,
                 report: Callable[[dict], None] | None = None, report_interval: float = 2.0):
        self.queue = queue
        self.topic = topic or names.queue_topic(namespace, queue)  # or a secondary queue's topic
        self._on_assign_hook = on_assign
        self._report, self._report_interval, self._reported_at = report, report_interval, 0.0
        self._dead_letter = dead_letter
        self._max_buffered = max_buffered
        self._revoke_grace = revoke_grace
        self._commit_barrier = commit_barrier
        self._cv = threading.Condition()
        self._groups: OrderedDict[str, deque[Buffered]] = OrderedDict()
        # Ready groups by (priority, age) of their head record: RECEIVE's pick without scanning
        # every buffered group. Entries go stale when a group's head changes or it is locked;
        # stale ones are dropped when they surface (see _pick) and a new head is always pushed.
        self._ready: list[tuple[tuple, int, str, tuple[int, int]]] = []
        self._ready_seq = itertools.count()
        self._locked: dict[str, Lease] = {}
        self._buffered = 0
        self._paused = False
        self._offsets: dict[int, PartitionOffsets] = {}
        self._eof: set[int] = set()
        self._closed = False
        self.consecutive_rollbacks = 0
        conf = {
            "bootstrap.servers": bootstrap, "logger": KAFKA_LOG,
            "group.id": self.topic,  # names.queue_group: a queue's group is named as its topic
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "partition.assignment.strategy": "cooperative-sticky",
            # A dead process's groups move to a live one after this long, not Kafka's 45 s.
            "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000,
            # librdkafka's read-ahead beyond what this process buffered (default 64 MiB): 16 MiB
            # keeps fetches ahead of any reader here and leaves the memory to the buffer, where
            # it makes RECEIVEs return more of each group.
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
        }
        self._consumer = Consumer(conf)
        self._group_meta = self._consumer.consumer_group_metadata()
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        self._thread = threading.Thread(target=self._poll_loop, name=f"kbroker-poll-{queue}", daemon=True)
        self._thread.start()

    def group_metadata(self) -> Any:
        """The consumer's group metadata (generation, member) as of the last poll. Taken on the
        poll thread: the consumer handle is busy there. A stale copy only makes Kafka refuse the
        commit (fencing), never accept a wrong one."""
        return self._group_meta

    # --- the poll thread ----------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._closed:
            try:
                records = self._consumer.consume(500, 0.1)
                self._group_meta = self._consumer.consumer_group_metadata()
            except Exception as exc:  # closed under us, or a fatal consumer error
                if not self._closed:
                    log.error("poll of %s failed: %s", self.topic, exc)
                    time.sleep(0.5)
                continue
            with self._cv:
                for rec in records:
                    self._accept(rec)
                self._apply_backpressure()
                self._cv.notify_all()
            if self._report is not None and time.monotonic() - self._reported_at >= self._report_interval:
                self._reported_at = time.monotonic()
                self._report(self.stats())

    def stats(self) -> dict:
        """What this process holds of the queue right now: the in-process half of the queue view."""
        with self._cv:
            return {"topic": self.topic, "partitions": sorted(self._offsets), "buffered": self._buffered,
                    "ready_groups": sum(1 for g in self._groups if g not in self._locked),
                    "locked_groups": len(self._locked),
                    "in_flight": sum(len(lease.taken) for lease in self._locked.values()),
                    "paused": self._paused}

    def _accept(self, rec: KafkaRecord) -> None:
        err = rec.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._eof.add(rec.partition())
            else:
                log.warning("consumer error on %s: %s", self.topic, err)
            return
        p, off = rec.partition(), rec.offset()
        tracker = self._offsets.get(p)
        if tracker is None:
            return  # a late record of a partition already revoked
        self._eof.discard(p)
        done = tracker.already_done(off)
        tracker.fetched(off)
        if done:
            return
        try:
            env = Envelope.from_headers(rec.headers())
            if rec.key() is None or rec.key().decode() != env.conversation_group_id:
                raise MalformedRecord("record key does not match the conversation group header")
        except (MalformedRecord, UnicodeDecodeError) as exc:
            self._dead_letter(self, rec, str(exc))
            return
        b = Buffered(env, rec)
        q = self._groups.setdefault(env.conversation_group_id, deque())
        _enqueue(q, b)
        self._buffered += 1
        if q[0] is b:
            self._mark(env.conversation_group_id, q)

    def _mark(self, group: str, q: deque[Buffered]) -> None:
        """The group's head changed (or it was unlocked): index it under its new head."""
        heapq.heappush(self._ready, _ready_entry(group, q, next(self._ready_seq)))
        if len(self._ready) > 4 * len(self._groups) + 1024:  # mostly stale: rebuild
            self._ready = [_ready_entry(name, g, next(self._ready_seq))
                           for name, g in self._groups.items() if name not in self._locked]
            heapq.heapify(self._ready)

    def _apply_backpressure(self) -> None:
        if not self._paused and self._buffered >= self._max_buffered:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
        elif self._paused and self._buffered <= self._max_buffered // 2:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._on_assign_hook()
        committed = consumer.committed(partitions, timeout=30)
        with self._cv:
            for tp in committed:
                self._offsets[tp.partition] = PartitionOffsets(max(tp.offset, 0), tp.metadata)
                self._eof.discard(tp.partition)
        consumer.incremental_assign(partitions)
        if self._paused:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        deadline = time.monotonic() + self._revoke_grace
        with self._cv:
            self._drop_buffered(revoked)
            while True:
                at_risk = [l for l in self._locked.values() if l.partitions & revoked and not l.included]
                if not at_risk or time.monotonic() >= deadline:
                    break
                self._cv.wait(deadline - time.monotonic())
            for lease in at_risk:
                lease.doomed = True
        # A Kafka transaction already carrying offsets of these partitions finishes first.
        self._commit_barrier()
        with self._cv:
            for p in revoked:
                self._offsets.pop(p, None)
                self._eof.discard(p)
            self._cv.notify_all()
        consumer.incremental_unassign(partitions)

    def _drop_buffered(self, revoked: set[int]) -> None:
        for group in list(self._groups):
            q = self._groups[group]
            kept = deque(b for b in q if b.record.partition() not in revoked)
            self._buffered -= len(q) - len(kept)
            if kept:
                self._groups[group] = kept
                if kept[0] is not q[0]:
                    self._mark(group, kept)
            else:
                del self._groups[group]

    # --- RECEIVE ------------------------------------------------------------------------------

    def _caught_up(self) -> bool:
        return bool(self._offsets) and self._eof >= set(self._offsets)

    def _pick(self, owner: Any, group_filter: str | None, conversation_filter: str | None) -> str | None:
        """The ready group a RECEIVE takes: highest priority, then oldest head record."""
        # Partitions whose commit metadata is near Kafka's limit hand out only their oldest
        # incomplete record, until it completes and the committed offset moves past the rest.
        full = {p: t.low_water() for p, t in self._offsets.items() if not t.metadata_room()}
        if group_filter is not None or conversation_filter is not None:
            return self._scan(owner, group_filter, conversation_filter, full)
        best, best_key = None, None
        for group, lease in self._locked.items():  # this transaction's own groups may give more
            q = self._groups.get(group)
            if lease.owner is owner and q and not _blocked(q, full):
                key = _head_key(q[0])
                if best_key is None or key < best_key:
                    best, best_key = group, key
        aside = []
        while self._ready:
            key, _, group, head = self._ready[0]
            q = self._groups.get(group)
            if not q or _position(q[0]) != head or group in self._locked:
                heapq.heappop(self._ready)  # stale, or locked (its release indexes it again)
                continue
            if _blocked(q, full):
                aside.append(heapq.heappop(self._ready))
                continue
            if best_key is None or key < best_key:
                best = group  # its entry goes stale when _take changes the head
            break
        for entry in aside:
            heapq.heappush(self._ready, entry)
        return best

    def _scan(self, owner: Any, group_filter: str | None, conversation_filter: str | None,
              full: dict[int, int]) -> str | None:
        """RECEIVE ... WHERE conversation_group_id / conversation_handle = ...: a linear look."""
        best, best_key = None, None
        candidates = self._groups.items() if group_filter is None else (
            [(group_filter, self._groups[group_filter])] if group_filter in self._groups else [])
        for group, q in candidates:
            lease = self._locked.get(group)
            if lease is not None and lease.owner is not owner:
                continue  # the group lock: held by another transaction
            if group_filter is not None and group != group_filter:
                continue
            if conversation_filter is not None and not any(
                    b.envelope.conversation_id == conversation_filter for b in q):
                continue
            if _blocked(q, full):
                continue
            key = _head_key(q[0])
            if best_key is None or key < best_key:
                best, best_key = group, key
        return best

    def receive(self, owner: Any, top: int, wait: float | None, *, conversation_group: str | None = None,
                conversation_id: str | None = None) -> tuple[Lease | None, list[Message]]:
        """Lease a group for `owner` and take up to `top` of its messages (expired ones are
        consumed but not returned). wait=0: what is there now; None: wait without time-out."""
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        catch_up_deadline = start + max(wait or 0.0, 30.0)
        with self._cv:
            while True:
                if self._closed:
                    return None, []
                group = self._pick(owner, conversation_group, conversation_id)
                if group is not None:
                    lease, msgs = self._take(owner, group, top, conversation_id)
                    if msgs or lease is not None:
                        return lease, msgs
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline and (self._caught_up() or now >= catch_up_deadline):
                    return None, []
                self._cv.wait(0.5 if deadline is None else max(min(deadline - now, 0.5), 0.01))

    def _take(self, owner: Any, group: str, top: int, conversation_id: str | None) -> tuple[Lease, list[Message]]:
        lease = self._locked.get(group) or Lease(self, group, owner)
        self._locked[group] = lease
        q = self._groups.pop(group)
        now_ms = int(time.time() * 1000)
        kept: deque[Buffered] = deque()
        msgs: list[Message] = []
        tracker = self._offsets.get(q[0].record.partition())
        if tracker is not None and not tracker.metadata_room():
            top = min(top, 1)  # only the low-water record (see _pick)
        while q and len(msgs) < top:
            b = q.popleft()
            if conversation_id is not None and b.envelope.conversation_id != conversation_id:
                kept.append(b)
                continue
            self._buffered -= 1
            lease.taken.append(b)
            lease.offsets.append(_position(b))
            if b.envelope.expires is None or b.envelope.expires > now_ms:
                msgs.append(self._to_message(b))
        kept.extend(q)
        if kept:
            self._groups[group] = kept
            self._groups.move_to_end(group, last=False)
            self._mark(group, kept)
        return lease, msgs

    def _to_message(self, b: Buffered) -> Message:
        env, rec = b.envelope, b.record
        return Message(
            queue=self.queue, conversation_handle=handle_for(env.conversation_id, env.to_side),
            conversation_id=env.conversation_id, conversation_group_id=env.conversation_group_id,
            message_sequence_number=env.message_sequence_number, message_type_name=env.message_type_name,
            service_name=env.to_service_name, service_contract_name=env.service_contract_name,
            message_id=env.message_id, body=rec.value() or b"", priority=env.priority,
            correlation_id=env.correlation_id, reply_to=env.reply_to, expires=env.expires,
            enqueued_time=rec.timestamp()[1], partition=rec.partition(), offset=rec.offset(),
            extra={"envelope": env, "record": rec},  # the record: re-keying copies its headers
        )

    def split(self, lease: Lease, offsets: list[tuple[int, int]]) -> Lease:
        """Move the records at `offsets` out of `lease` into a lease of their own (same group,
        no lock), so they can commit on their own: the re-keying of a moved conversation."""
        keys = set(offsets)
        with self._cv:
            side = Lease(self, lease.group, None)
            side.taken = [b for b in lease.taken if _position(b) in keys]
            lease.taken = [b for b in lease.taken if _position(b) not in keys]
            side.offsets = [o for o in lease.offsets if o in keys]
            lease.offsets = [o for o in lease.offsets if o not in keys]
            return side

    def dead_letter_lease(self, rec: KafkaRecord) -> Lease:
        """A lease over one malformed record, completed when its dead letter commits."""
        return Lease(self, None, None, offsets=[(rec.partition(), rec.offset())])

    # --- commit and rollback (called by the committer and by transactions) ------------------

    def include(self, leases: list[Lease]) -> list[TopicPartition] | None:
        """Mark leases as carried by a Kafka transaction and complete their offsets; returns the
        positions to commit, or None when a lease was doomed by a rebalance."""
        with self._cv:
            for lease in leases:
                if any(p not in self._offsets for p in lease.partitions):
                    lease.doomed = True  # its partition is gone: the next owner has it
            if any(lease.doomed for lease in leases):
                return None
            touched: set[int] = set()
            for lease in leases:
                lease.included = True
                for p, off in lease.offsets:
                    self._offsets[p].complete(off)
                    touched.add(p)
            out = []
            for p in sorted(touched):
                pos, meta = self._offsets[p].commit_position()
                out.append(TopicPartition(self.topic, p, pos, metadata=meta))
            return out

    def exclude(self, leases: list[Lease]) -> None:
        """The Kafka transaction aborted: the offsets are incomplete again."""
        with self._cv:
            for lease in leases:
                lease.included = False
                for p, off in lease.offsets:
                    if p in self._offsets:
                        self._offsets[p].reopen(off)

    def release(self, lease: Lease, committed: bool) -> None:
        """End a lease. Not committed: its records go back to the head of their group, in order
        (unless its partition was revoked: then the next owner reads them)."""
        with self._cv:
            if lease.group is not None and self._locked.get(lease.group) is lease:
                del self._locked[lease.group]
            if not committed and lease.group is not None and lease.taken and not lease.doomed:
                back = [b for b in lease.taken if b.record.partition() in self._offsets]
                if back:
                    q = self._groups.pop(lease.group, deque())
                    q.extendleft(reversed(back))
                    self._groups[lease.group] = q
                    self._groups.move_to_end(lease.group, last=False)
                    self._buffered += len(back)
            q = self._groups.get(lease.group) if lease.group is not None else None
            if q and lease.group not in self._locked:
                self._mark(lease.group, q)  # unlocked: ready again
            self._cv.notify_all()

    def close(self) -> None:
        self._closed = True
        with self._cv:
            self._cv.notify_all()
        self._thread.join(timeout=10)
        self._consumer.close()
