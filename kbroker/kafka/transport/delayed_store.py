"""The delayed store's topic and its mover: moves an endpoint's due delayed rows to their
destination queues (core/transport/delayed.py says what a row is).

The instances of an endpoint share the store's partitions as one consumer group. The holder of
a partition reads it whole (it is compacted: what is left is the rows not yet moved and recent
tombstones) into a DelayedSchedule, then moves each batch of due rows in one Kafka transaction:
a copy to the destination, the row's tombstone, and the group's positions, which fence an
instance that lost the partition. So a row is moved exactly once, by whoever holds it.

Before it moves anything after an assignment, the mover reads to the end its partitions had then
(their high watermarks): a transaction the previous holder committed just before losing the
partition (its tombstones there) is read before a row it moved could look due again. After a
failed move whose outcome is unknown, the producer is replaced (which ends the open
transaction) and the partitions are read again, so the log, not a guess, says what was moved.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dead_letter import dead_letter_record
from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.records import Record
from kbroker.core.rejected import Consumed
from kbroker.core.transport.bridge import message_record
from kbroker.core.transport.delayed import (
    BATCH_SIZE,
    MEMORY_BUDGET,
    DelayedMessage,
    DelayedSchedule,
    delayed_record,
    from_delayed,
)
from kbroker.core.txn.faults import Action, Deadline, decide
from kbroker.kafka import clients, messages
from kbroker.kafka.catalog.topic_specs import KEEP_EVERY_RECORD, TopicSpec
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.steps import FailureSink, LoggedOnce, report, run_steps
from kbroker.kafka.txn.close_open import OpenTransaction, close_open_aborted
from kbroker.kafka.txn.guarded import (
    GuardedProducer,
    TransactionFailed,
    aborted,
    replace_producer,
    service_producer,
    transact,
)

log = logging.getLogger("kbroker.transport.delayed")
COMPONENT = "delayed delivery"
MOVE_SECONDS = 10.0  # kbroker's own deadline on one move (as long as Kafka keeps it open)
INTERVAL = 1.0  # seconds between looks at most (the SQL transport's processing interval)
MOVE_TRIES = 3  # failed moves of one row alone before it goes to the dead-letter topic


def store_spec(topic: str, partitions: int, limit: int) -> TopicSpec:
    """The installer's topic of a delayed store: compacted (a moved row's tombstone removes
    it), every row kept until moved however far off it is due."""
    config = {
        "cleanup.policy": "compact",
        **KEEP_EVERY_RECORD,
        "max.message.bytes": str(limit),
        "min.compaction.lag.ms": "60000",
        "delete.retention.ms": "86400000",
    }
    return TopicSpec(topic, partitions, config, "transport delayed store", True)


class DelayedMover:
    """Moves the due rows of one endpoint's delayed store. Every receiving instance runs one;
    they share the store's partitions (a kill -9 hands an instance's to another).

    Parameters
    ----------
    exists: whether a destination queue is installed, (queue, fresh) (a row for a queue that is
        not goes to the dead-letter topic instead of failing every move); fresh after a failed
        move, when a queue may have been removed since it was last asked.
    batch_size: rows moved in one transaction (100).
    interval: the longest the mover waits between looks (1 s); a new row or the next due time
        wakes it sooner.
    budget: bytes of rows held in memory (DelayedSchedule)."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        topic: str,
        *,
        exists: Callable[[str, bool], bool],
        batch_size: int = BATCH_SIZE,
        interval: float = INTERVAL,
        budget: int = MEMORY_BUDGET,
        guard: FailureSink | None = None,
    ):
        self.namespace, self.topic = namespace, topic
        self._cluster = Cluster.of(cluster)
        self._exists, self._batch_size, self._interval = exists, batch_size, interval
        self._guard: FailureSink = guard or LoggedOnce(log)  # an outage is logged once
        self.schedule = DelayedSchedule(budget)  # touched by the mover's thread only
        self._held: dict[str, Any] = {}
        self._note()
        self.moved = 0
        self.dead_lettered = 0
        self.reads = 0  # whole reads of the partitions (assignments and re-reads)
        self.denied: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ends: dict[int, int] | None = None  # the partitions' ends to reach before moving
        self._fresh = False  # after a failed move: ask whether each destination is still there
        self._open: OpenTransaction | None = None  # a failed move's transaction, to close
        self._careful = 0  # after a failed move: this many moves of one row each, to find the row at fault
        self._tries: OrderedDict[bytes, tuple[int, str]] = OrderedDict()  # failed moves of one row alone
        self._consumer: Consumer = clients.consumer(
            self._cluster, topic, **{"session.timeout.ms": 10_000, "partition.assignment.strategy": "range"}
        )
        self._reading_refused = clients.reading_refused(self._cluster, "the delayed-delivery mover", topic, topic)
        self._transactional_id = f"{topic}.{uuid.uuid4()}"  # one for the mover's life (fences its own past)
        self._producer = self._new_producer()
        self.rejects = Rejects(cluster, namespace, COMPONENT)

    def _new_producer(self) -> GuardedProducer:
        return service_producer(self._cluster, self._transactional_id)

    def start(self) -> DelayedMover:
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._thread = threading.Thread(target=self._run, name="kbroker-delayed", daemon=True)
        self._thread.start()
        return self

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign([TopicPartition(p.topic, p.partition, OFFSET_BEGINNING) for p in partitions])
        self.schedule.clear()
        self._ends = None
        self.reads += 1

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.schedule.drop_partitions({p.partition for p in partitions})
        self._ends = None

    def _run(self) -> None:
        self.denied = run_steps(self.step, self._stop, COMPONENT, self._guard, log)

    # --- one step ----------------------------------------------------------------------------

    def step(self) -> None:
        """Read what came, then move the rows due (once the partitions are read to their ends)."""
        try:
            self._step()
        finally:
            self._note()

    def _step(self) -> None:
        if self._open is not None:
            self._close_open(self._open)
        now_ms = int(time.time() * 1000)
        nxt = self.schedule.next_due()
        wait = self._interval if nxt is None else min(self._interval, max(nxt - now_ms, 0) / 1000)
        batch = clients.consume_soon(self._consumer, 500, wait)
        for msg in messages.records(
            batch, lambda err: log.warning("delayed store: %s", err), refused=self._reading_refused
        ):
            try:  # anyone who may write the topic may write anything: set aside, never moved
                row = from_delayed(msg.key(), msg.value(), messages.raw_headers(msg), *messages.position(msg))
            except MalformedRecord as exc:
                self.rejects.reject(msg, str(exc))
                continue
            if row is None:
                self.schedule.remove(messages.key(msg))
            else:
                self.schedule.put(row)
        if not self._read_to_ends():
            return
        if self.schedule.exhausted:
            self._read_again()
            return
        due = self.schedule.pop_due(int(time.time() * 1000), 1 if self._careful else self._batch_size)
        if due:
            self._move(due)

    def _read_to_ends(self) -> bool:
        """Whether every assigned partition has been read to the end it had when assigned."""
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        if self._ends is None:
            ends = {}
            for tp in assigned:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=MOVE_SECONDS, cached=False)
                ends[tp.partition] = -1 if high <= low else high
            self._ends = ends
        positions = {tp.partition: tp.offset for tp in self._consumer.position(assigned)}
        return all(end < 0 or positions.get(p, -1) >= end for p, end in self._ends.items())

    def _read_again(self, *, known: bool = True) -> None:
        """Read the partitions from the start: for the rows dropped for the budget (`known`:
        every row held was moved, DelayedSchedule.read_again), or after a move of unknown
        outcome (nothing known: everything is read as new)."""
        assigned = self._consumer.assignment()
        if known:
            self.schedule.read_again({tp.partition: tp.offset for tp in self._consumer.position(assigned)})
        else:
            self.schedule.clear()
        self._ends = None
        self.reads += 1
        for tp in assigned:
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))

    # --- moving ------------------------------------------------------------------------------

    def _records(self, rows: list[DelayedMessage]) -> tuple[list[Record], int]:
        """The move's records, and how many of its rows go to the dead-letter topic."""
        out: list[Record] = []
        dead = 0
        for row in rows:
            msg = row.message
            tries, why = self._tries.get(row.key, (0, ""))
            if tries >= MOVE_TRIES:
                reason = f"could not be moved to {row.destination!r} in {tries} tries: {why}"
            elif not self._exists(row.destination, self._fresh):
                reason = f"destination queue {row.destination!r} is not installed"
            else:
                out.append(message_record(row.destination, self.namespace, msg))
                out.append((self.topic, row.key, None, None))
                continue
            _t, key, value, headers = delayed_record(self.topic, msg, row.destination, row.due_ms)
            stored = Consumed(self.topic, row.partition, row.offset, row.key, value, headers)
            out.append(dead_letter_record(self.namespace, stored, reason))
            dead += 1
            out.append((self.topic, row.key, None, None))
        return out, dead

    def _partitions(self, records: list[Record], rows: list[DelayedMessage]) -> list[int]:
        """Each record's partition: a tombstone goes to its row's own partition (whatever
        partitioner the client that wrote the row used), anything else where the producer's
        partitioner puts it (-1)."""
        own = {row.key: row.partition for row in rows}
        return [own[key] if topic == self.topic and key in own else -1 for topic, key, _v, _h in records]

    def _move(self, rows: list[DelayedMessage]) -> None:
        assigned = self._consumer.assignment()
        positions = [tp for tp in self._consumer.position(assigned) if tp.offset >= 0]
        offsets = [(positions, self._consumer.consumer_group_metadata())] if positions else []
        try:
            records, dead = self._records(rows)
        except Exception:  # a destination could not be looked up: the rows wait, the step fails
            for row in rows:
                self.schedule.put(row)
            raise
        deadline = Deadline(MOVE_SECONDS)
        try:
            transact(
                self._producer, records, offsets, deadline, MOVE_SECONDS, partitions=self._partitions(records, rows)
            )
        except TransactionFailed as failed:
            # It may be left open on a partition by a broker restart (kafka/txn/close_open.py):
            # closed before the next step reads or moves anything.
            self._open = OpenTransaction(frozenset(r[0] for r in records), frozenset(), (), time.time())
            if decide(failed.failure, deadline.left()) is Action.ABORT and aborted(self._producer, MOVE_SECONDS):
                for row in rows:
                    self.schedule.put(row)
            else:  # committed or not, the log will say: end the transaction, read again
                self._producer = replace_producer(
                    self._producer, self._new_producer, self._stop, lambda exc: report(self._guard, COMPONENT, exc, log)
                )
                self._read_again(known=False)
            self._fresh = True
            self._failed(rows, failed)
            raise  # run_steps reports the failure
        self._fresh = False
        self._careful = max(self._careful - 1, 0)
        for row in rows:
            self._tries.pop(row.key, None)
        self.moved += len(rows) - dead
        self.dead_lettered += dead

    def _close_open(self, open_txn: OpenTransaction) -> None:
        """Close a failed move's transaction as aborted on every partition of its topics, should
        a broker restart have left it open there (where it was closed, this changes nothing)."""
        try:
            close_open_aborted(self._producer, open_txn, lambda _group: None, Deadline(MOVE_SECONDS), MOVE_SECONDS)
        except TransactionFailed:
            self._producer = replace_producer(
                self._producer, self._new_producer, self._stop, lambda exc: report(self._guard, COMPONENT, exc, log)
            )
            raise
        self._open = None

    def _failed(self, rows: list[DelayedMessage], failed: TransactionFailed) -> None:
        """A move failed: the next moves take one row each; a row that fails alone MOVE_TRIES
        times goes to the dead-letter topic, so one row Kafka will not take (a queue removed, a
        write the authorizer refuses) does not hold the rows behind it."""
        self._careful = self._batch_size
        if len(rows) == 1:
            tries, _why = self._tries.pop(rows[0].key, (0, ""))
            self._tries[rows[0].key] = (tries + 1, str(failed))
            while len(self._tries) > 10_000:
                self._tries.popitem(last=False)

    # --- the rest ----------------------------------------------------------------------------

    def _note(self) -> None:
        """What the schedule holds, as stats() shows it: taken on the mover's thread, the only
        one that touches the schedule."""
        s = self.schedule
        self._held = {"held": len(s), "held_bytes": s.held_bytes, "horizon_ms": s.horizon, "next_due_ms": s.next_due()}

    def stats(self) -> dict[str, Any]:
        """What the mover holds (as of its last step) and has done."""
        return {
            "store": self.topic,
            **self._held,
            "moved": self.moved,
            "dead_lettered": self.dead_lettered,
            "reads": self.reads,
            "rejected": self.rejects.rejected,
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(MOVE_SECONDS + 5)
        try:
            self._consumer.close()
        except KafkaException as exc:
            log.warning("closing the delayed store's consumer: %s", exc)
        self._producer.abandon()
        self.rejects.close()

    def __enter__(self) -> DelayedMover:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
