"""QueueReceiver across a revocation and a new assignment of the same partition (no broker).

A transaction that held records of a partition when the group took it away (a session timeout
in a broker outage) may end after the partition came back: its records are then read again
from the committed offsets. Rolling it back must not put the old copies back in the buffer,
and committing it must not complete offsets of the new assignment: either delivered the same
messages twice (seen as duplicated replies after a broker restart)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from confluent_kafka import TopicPartition

from kbroker.kafka.receive.receiver import QueueReceiver
from tests.unit.test_receiver_assignment import TOPIC, Position, Record


class Consumer:
    """Just what the rebalance callbacks call; records are handed to the receiver by the test."""

    def __init__(self) -> None:
        self.assigned: list[int] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Position]:
        return [Position(TOPIC, tp.partition, 0, "") for tp in partitions]  # nothing committed yet

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += [tp.partition for tp in partitions]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.remove(tp.partition)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in self.assigned]

    def pause(self, partitions: Any) -> None:
        pass


def receiver_with_records(
    consumer: Consumer, count: int, barrier: Callable[[Callable[[], None]], None] = lambda serve: None
) -> QueueReceiver:
    receiver = QueueReceiver(
        "nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, revoke_grace=0.0, commit_barrier=barrier
    )
    receiver._assignment.on_assign(consumer, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    fetch(receiver, range(count))
    return receiver


def fetch(receiver: QueueReceiver, offsets: range) -> None:
    with receiver._cv:
        for off in offsets:
            receiver._poll._accept(Record(0, off))  # type: ignore[arg-type]


def reassign(receiver: QueueReceiver, consumer: Consumer, count: int) -> None:
    """The group takes partition 0 away and gives it back; it is read again from offset 0."""
    receiver._assignment.on_revoke(consumer, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    receiver._assignment.on_assign(consumer, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    fetch(receiver, range(count))


def offsets_of(receiver: QueueReceiver, top: int = 100) -> list[int]:
    lease, msgs = receiver.receive(object(), top, 0)
    assert lease is not None
    receiver.release(lease, committed=False)
    return [m.offset for m in msgs]


def test_a_rollback_after_the_partition_came_back_does_not_put_the_old_copies_back() -> None:
    consumer = Consumer()
    receiver = receiver_with_records(consumer, 4)
    lease, msgs = receiver.receive(object(), 2, 0)
    assert lease is not None and [m.offset for m in msgs] == [0, 1]
    assert receiver.include([lease]) is not None  # its Kafka transaction is under way: not doomed

    reassign(receiver, consumer, 4)
    receiver.exclude([lease])  # the transaction failed, and was rolled back after the new assignment
    receiver.release(lease, committed=False)

    assert offsets_of(receiver) == [0, 1, 2, 3], "each record once, from the new assignment"


def test_a_rollback_while_the_revocation_waits_for_the_transaction_puts_nothing_back() -> None:
    """The revocation waits for the Kafka transaction carrying the partition's offsets; when it
    fails, its records go back while the partition is still assigned, then the partition goes."""
    consumer = Consumer()
    taken: list[Any] = []

    def transaction_fails(serve: Callable[[], None]) -> None:
        for lease in taken:
            receiver.exclude([lease])
            receiver.release(lease, committed=False)
        taken.clear()

    receiver = receiver_with_records(consumer, 4, barrier=transaction_fails)
    lease, _ = receiver.receive(object(), 2, 0)
    assert lease is not None and receiver.include([lease]) is not None
    taken.append(lease)

    reassign(receiver, consumer, 4)
    assert offsets_of(receiver) == [0, 1, 2, 3], "each record once, from the new assignment"


def test_a_commit_after_the_partition_came_back_is_refused_and_completes_nothing() -> None:
    """A lease split off another (a re-keyed conversation's records) locks no group, so the
    revocation does not see it; it must still not commit into the new assignment."""
    consumer = Consumer()
    receiver = receiver_with_records(consumer, 3)
    lease, _ = receiver.receive(object(), 2, 0)
    assert lease is not None
    side = receiver.split(lease, [(0, 0), (0, 1)])
    receiver.release(lease, committed=True)

    reassign(receiver, consumer, 3)
    assert receiver.include([side]) is None, "the old assignment's offsets must not commit"
    receiver.release(side, committed=False)

    lease2, msgs = receiver.receive(object(), 10, 0)
    assert lease2 is not None and [m.offset for m in msgs] == [0, 1, 2]
    positions = receiver.include([lease2])
    assert positions is not None and [(tp.partition, tp.offset) for tp in positions] == [(0, 3)]


def test_within_one_assignment_a_rollback_still_puts_records_back_in_order() -> None:
    consumer = Consumer()
    receiver = receiver_with_records(consumer, 3)
    lease, _ = receiver.receive(object(), 2, 0)
    assert lease is not None
    receiver.release(lease, committed=False)
    assert offsets_of(receiver) == [0, 1, 2]


class SubscribingConsumer(Consumer):
    """Also what the poll loop calls: it keeps the rebalance callbacks subscribe() is given."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: dict[str, Callable[..., None]] = {}

    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self.callbacks = callbacks

    def consumer_group_metadata(self) -> str:
        return "meta"

    def consume(self, most: int, timeout: float) -> list[Any]:
        time.sleep(min(timeout, 0.05))
        return []


def test_a_lost_partition_dooms_its_leases_at_once() -> None:
    """The group expelled the process (a stall outlived its session) and gave the partition to
    another member already: a lease on it must not get the revocation's grace to be carried by a
    transaction, since whatever commits now overlaps the next owner. Fails on the code that
    handled a loss as a revocation (the callback waited out the grace)."""
    consumer = SubscribingConsumer()
    receiver = QueueReceiver("nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, revoke_grace=30.0)
    receiver._poll.start(consumer)  # type: ignore[arg-type]
    lost: threading.Thread | None = None
    try:
        consumer.callbacks["on_assign"](consumer, [TopicPartition(TOPIC, 0)])
        fetch(receiver, range(2))
        lease, msgs = receiver.receive(object(), 2, 0)
        assert lease is not None and [m.offset for m in msgs] == [0, 1]

        lost = threading.Thread(target=consumer.callbacks["on_lost"], args=(consumer, [TopicPartition(TOPIC, 0)]))
        lost.start()
        lost.join(5)
        assert not lost.is_alive(), "a lost partition's leases were given the revocation's grace"
        assert lease.doomed and receiver.include([lease]) is None, "a lease on a lost partition may not commit"
        assert consumer.assigned == []
    finally:
        receiver._closed = True
        receiver._poll.join(5)
        if lost is not None:
            lost.join(30)
