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

The per-group bookkeeping (buffered records, the ready heap, group locks) is the pure
kbroker.core.group_buffer; this module adds the consumer, its thread, offsets and leases.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaRecord

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.endpoint import handle_for
from kbroker.core.envelope import Envelope, MalformedRecord, Message
from kbroker.core.group_buffer import Buffered, GroupBuffer, full_partitions, receive_order
from kbroker.core.offsets import PartitionOffsets
from kbroker.kafka import clients, messages
from kbroker.kafka.reader import group_offsets, offsets_reader

log = logging.getLogger("kbroker.receiver")


QUEUED_MAX_KBYTES = 16 * 1024  # librdkafka read-ahead per consumer (see QueueReceiver)
# A partition whose committed offsets stay unreadable this long is held by a hanging transaction
# (Kafka aborts an open one after transaction.timeout.ms, 10 s for kbroker's producers).
HANGING_AFTER = 60.0


def decode_envelope(rec: KafkaRecord) -> Envelope:
    """A Service Broker message: its envelope, keyed by its receiving conversation group."""
    env = Envelope.from_headers(messages.headers(rec))
    key = rec.key()
    if key is None or key.decode() != env.conversation_group_id:
        raise MalformedRecord("record key does not match the conversation group header")
    return env


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
    # Each partition's tracker when its records were fetched. The lease completes, reopens and
    # puts back records only while that assignment lasts: after a revocation (and a new
    # assignment of the same partition) the records are read again from the committed offsets,
    # and completing or returning the old copies would deliver them twice.
    assignments: dict[int, Any] = field(default_factory=dict)

    @property
    def partitions(self) -> set[int]:
        """The partitions of the offsets this lease completes."""
        return {p for p, _ in self.offsets}


class QueueReceiver:
    """RECEIVE on one queue topic for every transaction of the process. Built without I/O;
    start() creates the consumer (with `new_consumer`, given the consumer settings) and its poll
    thread."""

    def __init__(self, cluster: ClusterLike, namespace: str, queue: str, *,
                 dead_letter: Callable[["QueueReceiver", KafkaRecord, str], None],
                 max_buffered: int = 20_000, revoke_grace: float = 5.0,
                 commit_barrier: Callable[[], None] = lambda: None, topic: str | None = None,
                 on_assign: Callable[[], None] = lambda: None,
                 report: Callable[[dict[str, Any]], None] | None = None, report_interval: float = 2.0,
                 new_consumer: Callable[[dict[str, Any]], Consumer] = Consumer,
                 decode: Callable[[KafkaRecord], Envelope] | None = None):
        self.queue = queue
        # How a record becomes what the buffer orders and groups (MalformedRecord: dead-letter
        # it): a Service Broker message by default, a transport message for transport queues.
        self._decode = decode or decode_envelope
        self.topic = topic or names.queue_topic(namespace, queue)  # or a secondary queue's topic
        self._cluster, self._new_consumer = Cluster.of(cluster), new_consumer
        self._on_assign_hook = on_assign
        self._report, self._report_interval, self._reported_at = report, report_interval, 0.0
        self._dead_letter = dead_letter
        self._max_buffered = max_buffered
        self._revoke_grace = revoke_grace
        self._commit_barrier = commit_barrier
        self._cv = threading.Condition()  # guards the buffer, the offsets and the leases
        self._buffer: GroupBuffer[Lease] = GroupBuffer()
        self._paused = False
        self._offsets: dict[int, PartitionOffsets] = {}
        self._eof: set[int] = set()
        self._closed = False
        self._consumer: Consumer | None = None
        self._offsets_reader: Consumer | None = None  # reads committed offsets when the consumer does not
        # Partitions the group gave this process that wait for readable committed offsets
        # (partition -> since when, monotonic), and whether that was logged.
        self._waiting: dict[int, float] = {}
        self._waiting_noted = self._hanging_noted = False
        self._waiting_asked = 0.0
        # The question about the waiting partitions' offsets under way (on `_asker`'s thread).
        self._waiting_read: concurrent.futures.Future[list[TopicPartition]] | None = None
        self._asker: concurrent.futures.ThreadPoolExecutor | None = None
        self._group_meta: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> "QueueReceiver":
        """Create the consumer, subscribe to the topic and start the poll thread; returns self."""
        conf = clients.base(self._cluster, **{
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
        })
        consumer = self._consumer = self._new_consumer(conf)
        self._group_meta = consumer.consumer_group_metadata()
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_revoke)
        self._thread = threading.Thread(target=self._poll_loop, args=(consumer,),
                                        name=f"kbroker-poll-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def group_metadata(self) -> Any:
        """The consumer's group metadata (generation, member) as of the last poll. Taken on the
        poll thread: the consumer handle is busy there. A stale copy only makes Kafka refuse the
        commit (fencing), never accept a wrong one."""
        return self._group_meta

    # --- the poll thread ----------------------------------------------------------------------

    def _poll_loop(self, consumer: Consumer) -> None:
        while not self._closed:
            try:
                records = consumer.consume(500, 0.1)
                self._group_meta = consumer.consumer_group_metadata()
            except BaseException as exc:  # closed under us, a fatal consumer error, or a callback's
                # error re-raised by librdkafka's binding (not always an Exception subclass)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                if not self._closed:
                    log.error("poll of %s failed: %s", self.topic, exc)
                    time.sleep(0.5)
                continue
            with self._cv:
                for rec in records:
                    self._accept(rec)
                self._apply_backpressure(consumer)
                self._cv.notify_all()
            if self._waiting or self._waiting_read is not None:
                self._ask_waiting(consumer)
            if self._report is not None and time.monotonic() - self._reported_at >= self._report_interval:
                self._reported_at = time.monotonic()
                self._report(self.stats())

    def stats(self) -> dict[str, Any]:
        """What this process holds of the queue right now: the in-process half of the queue view."""
        with self._cv:
            return {"topic": self.topic, "partitions": sorted(self._offsets), "waiting": sorted(self._waiting),
                    **self._buffer.stats(),
                    "paused": self._paused}

    def _accept(self, rec: KafkaRecord) -> None:
        err, p, off = rec.error(), rec.partition(), rec.offset()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF and p is not None:
                self._eof.add(p)
            else:
                log.warning("consumer error on %s: %s", self.topic, err)
            return
        if p is None or off is None:
            return  # only error events lack a position
        tracker = self._offsets.get(p)
        if tracker is None:
            return  # a late record of a partition already revoked
        self._eof.discard(p)
        done = tracker.already_done(off)
        tracker.fetched(off)
        if done:
            return
        try:
            env = self._decode(rec)
        except (MalformedRecord, UnicodeDecodeError) as exc:
            self._dead_letter(self, rec, str(exc))
            return
        self._buffer.accept(Buffered(env, rec, p, off, rec.timestamp()[1], tracker))

    def _apply_backpressure(self, consumer: Consumer) -> None:
        buffered = self._buffer.buffered
        if not self._paused and buffered >= self._max_buffered:
            consumer.pause(consumer.assignment())
            self._paused = True
        elif self._paused and buffered <= self._max_buffered // 2:
            consumer.resume(consumer.assignment())
            self._paused = False

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._on_assign_hook()
        with self._cv:
            for tp in partitions:
                self._waiting.setdefault(tp.partition, time.monotonic())
        self._assign_waiting(consumer, lambda tps: consumer.committed(tps, timeout=10))

    def _assign_waiting(self, consumer: Consumer,
                        read: Callable[[list[TopicPartition]], list[TopicPartition]]) -> None:
        """Assign the partitions the group gave this process whose committed offsets `read` can
        tell now, at those offsets; the rest wait for the poll loop to ask again (_ask_waiting,
        every second). One partition whose offsets stay unstable (a Kafka transaction holding them
        still open) must not keep the others from being read: after a broker restart such a
        transaction can only be closed by its producer's next commit, which may be this very
        process's, of offsets of the other partitions."""
        with self._cv:
            waiting = sorted(self._waiting)
        found: list[TopicPartition] = []
        if waiting:
            try:
                found = read([TopicPartition(self.topic, p) for p in waiting])
            except (KafkaException, concurrent.futures.TimeoutError) as exc:
                self._note_waiting(f"{exc}")
        ready = [tp for tp in found if tp.error is None]
        if len(ready) < len(found):
            self._note_waiting("; ".join(f"[{tp.partition}] {tp.error}" for tp in found if tp.error is not None))
        with self._cv:
            for tp in ready:
                self._offsets[tp.partition] = PartitionOffsets(max(tp.offset, 0), tp.metadata)
                self._eof.discard(tp.partition)
                self._waiting.pop(tp.partition, None)
        # At the offsets just read, so the consumer does not fetch them again itself: after a
        # broker restart its own fetch was seen to meet a stale coordinator and leave the
        # partitions unfetched for good (librdkafka issue #5586), a reader idle for ever. Called
        # even with none: in the rebalance callback, assigning nothing keeps the binding from
        # assigning every partition itself at the offsets the consumer would fetch.
        start = [TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                 for tp in ready]
        consumer.incremental_assign(start)
        if not start:
            return
        if self._paused:
            consumer.pause(start)
        if self._waiting_noted:
            log.warning("partitions %s of %s assigned after waiting for their committed offsets",
                        [tp.partition for tp in ready], self.topic)
        if not self._waiting:
            self._waiting_noted = self._hanging_noted = False

    def _note_waiting(self, why: str) -> None:
        """Say once that partitions wait for their committed offsets, and once more (an error)
        when one has waited long enough to be a hanging transaction rather than a slow one."""
        if not self._waiting_noted:
            self._waiting_noted = True
            log.warning("committed offsets of %s not read yet (%s); asking again", self.topic, why)
        longest = time.monotonic() - min(self._waiting.values(), default=time.monotonic())
        if longest >= HANGING_AFTER and not self._hanging_noted:
            self._hanging_noted = True
            log.error("committed offsets of %s partitions %s unreadable for %.0f s (%s): a Kafka transaction "
                      "holding them is still open. The next commit of its producer closes it; if that "
                      "process is gone, find it with `kafka-transactions.sh find-hanging` and abort it",
                      self.topic, sorted(self._waiting), longest, why)

    def _ask_waiting(self, consumer: Consumer) -> None:
        """Once a second, ask for the committed offsets of the partitions still waiting, on a
        thread of its own: while a Kafka transaction holds a partition's offsets the answer
        takes seconds (reader.group_offsets), and the poll thread must go on fetching the
        partitions it has. The answer is assigned here, on the poll thread, once it is in."""
        asked = self._waiting_read
        if asked is not None:
            if not asked.done():
                return
            self._waiting_read = None

            def answered(tps: list[TopicPartition]) -> list[TopicPartition]:
                still = {tp.partition for tp in tps}  # one may have been revoked meanwhile
                return [tp for tp in asked.result() if tp.partition in still]

            self._assign_waiting(consumer, answered)
            return
        if self._waiting and time.monotonic() - self._waiting_asked >= 1.0:
            self._waiting_asked = time.monotonic()
            if self._asker is None:
                self._asker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"kbroker-offsets-{self.queue}")
            with self._cv:
                waiting = [TopicPartition(self.topic, p) for p in sorted(self._waiting)]
            self._waiting_read = self._asker.submit(self._committed_by_reader, waiting)

    def _committed_by_reader(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Committed offsets asked of the group coordinator by a consumer that never joins the
        group (reader.group_offsets): after a broker restart the group's own consumer was seen
        never to answer."""
        if self._offsets_reader is None:
            self._offsets_reader = offsets_reader(self._cluster, self.topic)  # a queue's group is named as its topic
        return group_offsets(self._offsets_reader, partitions, 10)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        deadline = time.monotonic() + self._revoke_grace
        with self._cv:
            for p in revoked:
                self._waiting.pop(p, None)  # never handed to the consumer
            assigned = [tp for tp in partitions if tp.partition in self._offsets]
            self._buffer.drop_partitions(revoked)
            while True:
                at_risk = [l for l in self._buffer.holders() if l.partitions & revoked and not l.included]
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
            # Records a transaction that failed during the barrier put back: gone with the rest.
            self._buffer.drop_partitions(revoked)
            self._cv.notify_all()
        if assigned:
            consumer.incremental_unassign(assigned)

    # --- RECEIVE ------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Records buffered here and not taken: what a monitoring loop counts as waiting."""
        with self._cv:
            return self._buffer.buffered

    def wait_for_waiting(self, timeout: float) -> int:
        """Wait up to `timeout` s for a buffered record not taken yet; returns how many there are."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._buffer.buffered and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(left, 0.5))
            return self._buffer.buffered

    def _caught_up(self) -> bool:
        return bool(self._offsets) and self._eof >= set(self._offsets)

    def receive(self, owner: Any, top: int, wait: float | None, *, conversation_group: str | None = None,
                conversation_id: str | None = None,
                give_up: Callable[[], bool] = lambda: False) -> tuple[Lease | None, list[Message]]:
        """Lease a group for `owner` and take up to `top` of its messages (expired ones are
        consumed but not returned). wait=0: what is there now; None: wait without time-out.
        `give_up` is asked while waiting (every 0.5 s at most): True ends the wait empty."""
        lease, live, _expired = self.take(owner, top, wait, conversation_group=conversation_group,
                                          conversation_id=conversation_id, give_up=give_up)
        return lease, [self._to_message(b) for b in live]

    def take(self, owner: Any, top: int, wait: float | None, *, conversation_group: str | None = None,
             conversation_id: str | None = None,
             give_up: Callable[[], bool] = lambda: False) -> tuple[Lease | None, list[Buffered], int]:
        """receive() as the buffered records: the lease, the live records taken in RECEIVE order
        (each with the envelope the receiver's decode made), and how many expired ones were taken
        with them."""
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        catch_up_deadline = start + max(wait or 0.0, 30.0)
        with self._cv:
            while True:
                if self._closed:
                    return None, [], 0
                full = full_partitions(self._offsets)
                group = self._buffer.pick(owner, full, conversation_group, conversation_id)
                if group is not None:
                    return self._take(owner, group, top, full, conversation_id)
                now = time.monotonic()
                if deadline is not None and now >= deadline and (self._caught_up() or now >= catch_up_deadline):
                    return None, [], 0
                if give_up():
                    return None, [], 0
                self._cv.wait(0.5 if deadline is None else max(min(deadline - now, 0.5), 0.01))

    def _take(self, owner: Any, group: str, top: int, full: dict[int, int],
              conversation_id: str | None) -> tuple[Lease, list[Buffered], int]:
        lease = self._buffer.holder(group) or Lease(self, group, owner)
        now_ms = int(time.time() * 1000)
        taken = self._buffer.take(lease, group, top, full, now_ms, conversation_id)
        lease.taken.extend(taken)
        lease.offsets.extend(b.position for b in taken)
        for b in taken:
            lease.assignments.setdefault(b.partition, b.assignment)
        live = [b for b in receive_order(taken) if b.live(now_ms)]
        return lease, live, len(taken) - len(live)

    def _to_message(self, b: Buffered) -> Message:
        env, rec = b.envelope, b.record
        return Message(
            queue=self.queue, conversation_handle=handle_for(env.conversation_id, env.to_side),
            conversation_id=env.conversation_id, conversation_group_id=env.conversation_group_id,
            message_sequence_number=env.message_sequence_number, message_type_name=env.message_type_name,
            service_name=env.to_service_name, service_contract_name=env.service_contract_name,
            message_id=env.message_id, body=rec.value() or b"", priority=env.priority,
            correlation_id=env.correlation_id, reply_to=env.reply_to, expires=env.expires,
            enqueued_time=b.enqueued_ms, partition=b.partition, offset=b.offset,
            extra={"envelope": env, "record": rec},  # the record: re-keying copies its headers
        )

    def split(self, lease: Lease, offsets: list[tuple[int, int]]) -> Lease:
        """Move the records at `offsets` out of `lease` into a lease of their own (same group,
        no lock), so they can commit on their own: the re-keying of a moved conversation."""
        keys = set(offsets)
        with self._cv:
            side = Lease(self, lease.group, None, assignments=dict(lease.assignments))
            side.taken = [b for b in lease.taken if b.position in keys]
            lease.taken = [b for b in lease.taken if b.position not in keys]
            side.offsets = [o for o in lease.offsets if o in keys]
            lease.offsets = [o for o in lease.offsets if o not in keys]
            return side

    @property
    def closed(self) -> bool:
        """Whether close() has begun."""
        return self._closed

    def dead_letter_lease(self, rec: KafkaRecord) -> Lease:
        """A lease over one malformed record, completed when its dead letter commits."""
        p, off = messages.position(rec)
        return Lease(self, None, None, offsets=[(p, off)], assignments={p: self._offsets.get(p)})

    # --- commit and rollback (called by the committer and by transactions) ------------------

    def include(self, leases: list[Lease]) -> list[TopicPartition] | None:
        """Mark leases as carried by a Kafka transaction and complete their offsets; returns the
        positions to commit, or None when a lease was doomed by a rebalance."""
        with self._cv:
            for lease in leases:
                if not all(self._current(lease, p) for p in lease.partitions):
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

    def _current(self, lease: Lease, partition: int) -> bool:
        """Whether `lease`'s records of `partition` belong to its current assignment here."""
        tracker = self._offsets.get(partition)
        return tracker is not None and lease.assignments.get(partition) is tracker

    def exclude(self, leases: list[Lease]) -> None:
        """The Kafka transaction aborted: the offsets are incomplete again."""
        with self._cv:
            for lease in leases:
                lease.included = False
                for p, off in lease.offsets:
                    if self._current(lease, p):
                        self._offsets[p].reopen(off)

    def release(self, lease: Lease, committed: bool) -> None:
        """End a lease. Not committed: its records go back to the head of their group, in order
        (unless its partition was revoked: then the next owner reads them)."""
        with self._cv:
            if lease.group is not None:
                back = [] if committed or lease.doomed else [
                    b for b in lease.taken if b.assignment is not None
                    and self._offsets.get(b.partition) is b.assignment]
                self._buffer.release(lease, lease.group, back)
            self._cv.notify_all()

    def close(self) -> None:
        """Stop the poll thread and close the consumer (if start() made them)."""
        self._closed = True
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._consumer is not None:
            self._consumer.close()
        if self._asker is not None:
            self._asker.shutdown(wait=True)
        if self._offsets_reader is not None:
            self._offsets_reader.close()
