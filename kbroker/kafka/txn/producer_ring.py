"""The group committer's ring of transactional producers: creating, replacing and fencing them.

Kafka transactions run one at a time, in submission order, but on a small ring of transactional
producers: right after a commit the coordinator is still writing that transaction's markers and
answers the same producer's next transaction with CONCURRENT_TRANSACTIONS until it is done,
while another producer can start at once. Order is unchanged: each transaction has committed
before the next one begins, so their records reach the log in commit order.

Each place of the ring (a Slot) keeps its transactional.id for good. Its producer is replaced by
a new one with the same id whenever it is stuck, fenced or its transaction failed: the new one's
init bumps the producer epoch, which fences the old one and ends the open transaction it left.
A slot that may have left an open transaction behind closes it before the new producer's first
transaction (close_open.py). The ring counts the producers it created (its generation): a
transaction that took a conversation lease commits only on producers at least as old as its
lease check (core/dialogs/send_lease.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import KafkaException, Producer

from kbroker.core.cluster import ClusterLike
from kbroker.core.txn.commit_holder import transactional_id
from kbroker.core.txn.faults import Deadline
from kbroker.kafka import clients
from kbroker.kafka.txn.close_open import GroupMetadata, OpenTransaction, close_open_aborted
from kbroker.kafka.txn.guarded import CallDeadlineExceeded, GuardedProducer, TransactionFailed, reason, started

log = logging.getLogger("kbroker.committer")


@dataclass(eq=False)
class Slot:
    """A place in the producer ring: a transactional.id kept for good, and the producer that
    currently has it (None until created, and after it was abandoned)."""

    transactional_id: str
    producer: GuardedProducer | None = None
    # A failed transaction of this id whose markers may be missing, an open transaction: the
    # next producer closes it (as aborted) before its first transaction (close_open.py).
    open_transaction: OpenTransaction | None = None


class ProducerRing:
    """The transactional producers the committer's Kafka transactions take turns on. Built
    without I/O: a slot's producer is created (with `new_producer`, given its settings) and
    initialised at its first use, ready()."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        *,
        producers: int,
        transactional_ids: tuple[str, ...],
        new_producer: Callable[[dict[str, Any]], Producer],
        timeout: float,
        transaction_deadline: float,
        group_metadata: GroupMetadata,
        closed: Callable[[], bool],
    ):
        self._make_producer, self._timeout = new_producer, timeout
        self._transaction_deadline = transaction_deadline
        self._group_metadata = group_metadata  # what a closing transaction sends its offsets with
        self._closed = closed  # whether the committer is closing: no producer is created then
        self._conf: dict[str, Any] = clients.base(
            cluster,
            **{
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "message.max.bytes": clients.MAX_MESSAGE_BYTES,
                # Right after a commit the coordinator is still writing markers and answers the next
                # transaction's first request with CONCURRENT_TRANSACTIONS; the retry back-off then
                # dominates every commit. Measured on the embedded broker, a transaction of one
                # offset commit takes 114 ms at the default 100 ms, 9.4 ms at 5/50 ms and 4.6 ms at 1/5 ms.
                "retry.backoff.ms": 1,
                "retry.backoff.max.ms": 5,
                # A process killed mid-commit leaves its Kafka transaction open; readers of those
                # partitions wait at the last stable offset until Kafka aborts it after this long.
                "transaction.timeout.ms": 10_000,
            },
        )
        # transactional_ids: the ring's ids chosen by the caller (who names them before the start).
        self.slots = [Slot(tid) for tid in transactional_ids] or [
            Slot(transactional_id(namespace, uuid.uuid4())) for _ in range(max(1, producers))
        ]
        self._turn = 0  # the ring's producer for the next Kafka transaction
        # Producers created so far. A transaction that took a conversation lease commits only on
        # producers at least as old as its lease check: if the lease ran out and another process
        # fenced this one's transactional ids, those producers are fenced too, whereas a
        # replacement created after the fence would commit (core/dialogs/send_lease.py).
        self.generation = 0

    @property
    def transactional_ids(self) -> tuple[str, ...]:
        """The ring's transactional ids: fencing them stops the ring's open transactions."""
        return tuple(slot.transactional_id for slot in self.slots)

    @property
    def current(self) -> Slot:
        """The slot the next Kafka transaction runs on."""
        return self.slots[self._turn]

    def take_turn(self) -> Slot:
        """The slot the next Kafka transaction runs on; the one after it is next."""
        slot = self.slots[self._turn]
        self._turn = (self._turn + 1) % len(self.slots)
        return slot

    def ready(self, slot: Slot, seconds: float) -> GuardedProducer:
        """`slot`'s producer, created and initialised (bounded by `seconds`) if it has none."""
        if slot.producer is not None and not slot.producer.abandoned:
            return slot.producer
        deadline = Deadline(seconds)
        producer = self._start(slot, seconds)
        if slot.open_transaction is not None:
            try:
                close_open_aborted(
                    producer,
                    slot.open_transaction,
                    self._group_metadata,
                    deadline,
                    deadline.call_timeout(self._timeout, floor=1.0),
                )
            except TransactionFailed as failed:  # its callers expect the call's own error
                assert isinstance(failed.__cause__, (KafkaException, CallDeadlineExceeded))
                raise failed.__cause__ from None
            finally:
                producer.abandon()  # as after any abort: the next one's sequence numbers start afresh
            slot.open_transaction = None
            producer = self._start(slot, deadline.call_timeout(self._timeout, floor=1.0))
        slot.producer = producer
        self.generation += 1
        return producer

    def _start(self, slot: Slot, seconds: float) -> GuardedProducer:
        return started(
            self._make_producer({**self._conf, "transactional.id": slot.transactional_id}),
            slot.transactional_id,
            seconds,
        )

    def restock(self) -> None:
        """While idle, give every slot whose producer was abandoned a new one. Its init fences
        the abandoned producer at once, which aborts the open transaction it left: until then
        that transaction's pending offsets keep the queue's committed offsets unstable (an
        assignment cannot read them) and its records hold back read_committed readers."""
        for slot in self.slots:
            if slot.producer is None and not self._closed():
                try:
                    self.ready(slot, self._transaction_deadline)
                    log.warning("transactional producer %s replaced", slot.transactional_id)
                except (KafkaException, CallDeadlineExceeded) as exc:
                    log.warning("no new transactional producer yet (%s); trying again", reason(exc))

    def recycle_idle(self, failed: Slot) -> None:
        """After a failed transaction, give the ring's other (idle) producers up too; the next
        use creates them anew. A producer that lived through a broker restart was seen to hang in
        its next send_offsets_to_transaction (a stale coordinator, librdkafka #5511), and its
        replacement then aborted that transaction. Worse, a transaction of it that committed
        just as the broker stopped can be left an open transaction without its markers (the
        broker's coordinator says committed, the partitions hold it open: its offsets stay
        unstable); the next marker of the same producer id settles it, so that must be a commit,
        not the abort of a hung call. A fresh producer's init finds no open transaction (nothing
        is aborted) and its first commit closes the left-over one as committed."""
        for other in self.slots:
            if other is not failed and other.producer is not None:
                self.abandon(other)

    def abandon(self, slot: Slot) -> None:
        """Never use `slot`'s producer again; the slot's next use creates a new one."""
        if slot.producer is not None:
            slot.producer.abandon()
            slot.producer = None

    def abandon_all(self) -> None:
        """Abandon every producer of the ring (their threads end, and librdkafka's producers
        with them)."""
        for slot in self.slots:
            self.abandon(slot)
