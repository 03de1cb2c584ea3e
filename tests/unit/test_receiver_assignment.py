"""QueueReceiver's assignment over a fake consumer (no broker): partitions are handed to the
consumer at the committed offsets the receiver read, never left for the consumer to fetch; one
partition whose committed offsets are unstable (a Kafka transaction holding them is still open)
waits on its own while the others are read, and is assigned once they are stable."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from kbroker.core.cluster import Cluster
from kbroker.core.dialogs.envelope import Envelope
from kbroker.kafka.receive.partition_assignment import PartitionAssignment
from kbroker.kafka.receive.receiver import QueueReceiver

TOPIC = "kbroker.test.queue.Q"
UNSTABLE = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)


@dataclass
class Position:
    """A committed offset as librdkafka reports it, with the per-partition error a real
    TopicPartition carries (it cannot be built with one)."""

    topic: str
    partition: int
    offset: int = -1001
    metadata: str | None = None
    error: KafkaError | None = None


class Record:
    def __init__(self, partition: int, offset: int) -> None:
        group = f"g{partition}"
        self._p, self._off = partition, offset
        self._env = Envelope(f"m{partition}-{offset}", group, group, offset, "T", "C", "F", "S", "TARGET")

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._off

    def headers(self) -> list[tuple[str, bytes]]:
        return self._env.headers()

    def key(self) -> bytes:
        return self._env.conversation_group_id.encode()

    def value(self) -> bytes:
        return b"x"

    def timestamp(self) -> tuple[int, int]:
        return (1, 10**12)


class Consumer:
    """Two partitions given by the group; records flow only from what was assigned, from the
    offset it was assigned at. committed() says partition 1's offsets are unstable."""

    def __init__(self, records: dict[int, int]) -> None:
        self._records = records  # partition -> how many records it holds
        self._lock = threading.Lock()
        self.assigned: dict[int, int] = {}  # partition -> next offset to deliver
        self.assign_calls: list[list[tuple[int, int]]] = []
        self._on_assign: Callable[..., None] | None = None
        self._joined = False

    def subscribe(self, topics: list[str], on_assign: Callable[..., None], **_: Any) -> None:
        self._on_assign = on_assign

    def consumer_group_metadata(self) -> str:
        return "meta"

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Position]:
        return [
            Position(TOPIC, tp.partition, error=UNSTABLE) if tp.partition == 1 else Position(TOPIC, tp.partition, 2, "")
            for tp in partitions
        ]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self.assign_calls.append([(tp.partition, tp.offset) for tp in partitions])
            for tp in partitions:
                assert tp.partition not in self.assigned, "assigned twice"
                self.assigned[tp.partition] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in self.assigned]

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        if not self._joined and self._on_assign is not None:
            self._joined = True
            self._on_assign(self, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        with self._lock:
            out = []
            for p, nxt in self.assigned.items():
                if nxt < self._records[p]:
                    out.append(Record(p, nxt))
                    self.assigned[p] = nxt + 1
        if not out:
            time.sleep(0.005)
        return out

    def close(self) -> None:
        pass


def receive_all(receiver: QueueReceiver, count: int, timeout: float) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        lease, msgs = receiver.receive(object(), 10, 0.05)
        if lease is not None:
            got += [(m.partition, m.offset) for m in msgs]
            receiver.release(lease, committed=True)
    return got


def test_an_unstable_partition_waits_alone_and_is_assigned_once_stable() -> None:
    consumer = Consumer({0: 5, 1: 4})
    receiver = QueueReceiver(
        "nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, new_consumer=lambda conf: consumer
    )  # type: ignore[arg-type,return-value]
    stable = threading.Event()
    asked: list[list[int]] = []

    def reader_read(partitions: list[TopicPartition]) -> list[Position]:
        asked.append([tp.partition for tp in partitions])
        return [
            Position(TOPIC, tp.partition, 1, "") if stable.is_set() else Position(TOPIC, tp.partition, error=UNSTABLE)
            for tp in partitions
        ]

    receiver._committed_by_reader = reader_read  # type: ignore[method-assign]  # no offsets reader here
    receiver.start()
    try:
        # Partition 0 is read from its committed offset (2) while partition 1 waits.
        assert receive_all(receiver, 3, 5.0) == [(0, 2), (0, 3), (0, 4)]
        assert consumer.assign_calls[0] == [(0, 2)], "assigned at the offset read, not left to the consumer"
        assert receiver.stats()["partitions"] == [0] and receiver.stats()["waiting"] == [1]
        time.sleep(1.2)
        assert asked and all(a == [1] for a in asked), "only the waiting partition is asked about again"
        assert 1 not in consumer.assigned

        stable.set()  # the transaction holding partition 1's offsets ended
        assert receive_all(receiver, 3, 5.0) == [(1, 1), (1, 2), (1, 3)]
        assert consumer.assign_calls[-1] == [(1, 1)]
        assert receiver.stats()["partitions"] == [0, 1] and receiver.stats()["waiting"] == []
    finally:
        receiver.close()


def test_a_slow_answer_for_a_waiting_partition_does_not_stop_the_others() -> None:
    """While an open transaction holds a partition's offsets, asking about it takes seconds (a
    consumer's committed() waits out its timeout). The poll thread asks on a thread of its own,
    so records of the partitions it has still arrive meanwhile."""
    consumer = Consumer({0: 3, 1: 4})
    receiver = QueueReceiver(
        "nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, new_consumer=lambda conf: consumer
    )  # type: ignore[arg-type,return-value]
    asking = threading.Event()

    def slow_read(partitions: list[TopicPartition]) -> list[Position]:
        asking.set()
        time.sleep(3.0)
        return [Position(TOPIC, tp.partition, error=UNSTABLE) for tp in partitions]

    receiver._committed_by_reader = slow_read  # type: ignore[method-assign]  # no offsets reader here
    receiver.start()
    try:
        assert receive_all(receiver, 1, 5.0) == [(0, 2)]
        assert asking.wait(3.0), "the waiting partition is asked about"
        with consumer._lock:
            consumer._records[0] = 5  # two more records while the question is under way
        t0 = time.monotonic()
        assert receive_all(receiver, 2, 5.0) == [(0, 3), (0, 4)]
        assert time.monotonic() - t0 < 1.5, "the records waited for the slow answer"
        assert 1 not in consumer.assigned
    finally:
        receiver.close()


def test_a_partition_left_waiting_is_handed_to_the_fence_after_a_second_and_read_once_fenced() -> None:
    """A partition whose offsets a dead reader's open transaction holds: after FENCE_AFTER (1 s)
    it, and only it, goes to the fence (kafka/receive/open_transaction_fence.py); once the fence has ended the
    transaction its offsets are stable and it is read. Not before the second: a transaction
    about to commit is not the fence's business."""
    consumer = Consumer({0: 3, 1: 2})
    receiver = QueueReceiver(
        "nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, new_consumer=lambda conf: consumer
    )  # type: ignore[arg-type,return-value]
    fenced = threading.Event()
    calls: list[tuple[float, list[int]]] = []

    def fence(partitions: list[TopicPartition]) -> tuple[str, ...]:
        calls.append((time.monotonic(), [tp.partition for tp in partitions]))
        fenced.set()
        return ("kbroker.test.x",)

    def reader_read(partitions: list[TopicPartition]) -> list[Position]:
        return [
            Position(TOPIC, tp.partition, 0, "") if fenced.is_set() else Position(TOPIC, tp.partition, error=UNSTABLE)
            for tp in partitions
        ]

    receiver._committed_by_reader = reader_read  # type: ignore[method-assign]  # no offsets reader here
    receiver._assignment._fence_hanging = fence  # what committer_ids would build, without a broker
    started = time.monotonic()
    receiver.start()
    try:
        assert receive_all(receiver, 1, 5.0) == [(0, 2)]
        assert receive_all(receiver, 2, 6.0) == [(1, 0), (1, 1)], "the fenced partition was not read"
        assert calls and calls[0][1] == [1], calls
        assert calls[0][0] - started >= 1.0, "fenced before the partition had waited a second"
    finally:
        receiver.close()


class BindingConsumer:
    """What confluent-kafka's binding does around a rebalance callback: if the callback neither
    assigns nor unassigns, it unassigns the revoked partitions itself, and that fails for a
    partition never assigned ("Can't subtract from empty assignment"), leaving the revocation
    unfinished. committed() times out, as it does on a slow cluster."""

    def __init__(self) -> None:
        self.assigned: set[int] = set()
        self.unassign_calls: list[list[int]] = []
        self._called = False
        self.refuse_assign = False  # as librdkafka does once the group expelled this member

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Position]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._called = True
        if self.refuse_assign and partitions:
            raise KafkaException(KafkaError(KafkaError._STATE, "the current assignment is lost"))
        self.assigned |= {tp.partition for tp in partitions}

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in sorted(self.assigned)]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._called = True
        self.unassign_calls.append([tp.partition for tp in partitions])
        missing = {tp.partition for tp in partitions} - self.assigned
        if missing:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "Can't subtract from empty assignment"))
        self.assigned -= {tp.partition for tp in partitions}

    def callback(self, handler: Callable[..., None], partitions: list[TopicPartition], revoke: bool) -> None:
        self._called = False
        handler(self, partitions)
        if not self._called:  # the binding's own call, as after a callback that made none
            (self.incremental_unassign if revoke else self.incremental_assign)(partitions)


def test_revoking_partitions_that_still_wait_for_their_offsets_finishes_the_revocation() -> None:
    """At start-up the first ask for committed offsets can time out, so every partition given
    waits; when another process joins and some are revoked, the callback must itself unassign
    (nothing): left to the binding, the unassign fails and the revocation never finishes, so
    the group withholds the partitions from the process that joined. Fails on the code that
    unassigned only when something had been assigned."""
    cv = threading.Condition()
    settled: list[set[int]] = []
    assignment = PartitionAssignment(
        Cluster.of("nowhere:1"),
        TOPIC,
        "Q",
        cv,
        settle_revoked=lambda revoked, since, lost: settled.append(revoked),
        forget_revoked=lambda revoked: None,
        commit_barrier=lambda serve: None,
        on_assign=lambda: None,
    )
    consumer = BindingConsumer()
    consumer.callback(assignment.on_assign, [TopicPartition(TOPIC, p) for p in range(4)], revoke=False)
    assert sorted(assignment.waiting) == [0, 1, 2, 3] and not consumer.assigned
    consumer.callback(assignment.on_revoke, [TopicPartition(TOPIC, 2), TopicPartition(TOPIC, 3)], revoke=True)
    assert consumer.unassign_calls == [[]], "the revocation was left to the binding, which fails"
    assert sorted(assignment.waiting) == [0, 1] and settled == [{2, 3}]


def test_an_expulsion_after_a_refused_assignment_still_finishes_the_revocation() -> None:
    """The offsets of waiting partitions come in after the group expelled this process, and the
    consumer refuses to take them; then the expulsion's callback comes. The partitions must be
    waiting again (no offsets stand for partitions the consumer does not hold) and the callback
    must unassign only what the consumer holds: an unassign naming the others fails, the
    revocation stays unfinished, and librdkafka never joins the group again (a reader that
    received nothing for the rest of a broker-restart test). Fails on the code that kept the
    offsets and unassigned every partition it had offsets for."""
    cv = threading.Condition()
    assignment = PartitionAssignment(
        Cluster.of("nowhere:1"),
        TOPIC,
        "Q",
        cv,
        settle_revoked=lambda revoked, since, lost: None,
        forget_revoked=lambda revoked: None,
        commit_barrier=lambda serve: None,
        on_assign=lambda: None,
    )
    consumer = BindingConsumer()
    everything = [TopicPartition(TOPIC, p) for p in range(4)]
    consumer.callback(assignment.on_assign, everything[:2], revoke=False)  # both wait (committed() timed out)
    offsets_read = lambda tps: [Position(TOPIC, tp.partition, 5, "") for tp in tps]  # noqa: E731
    assignment._assign_waiting(consumer, offsets_read)  # type: ignore[arg-type]
    assert consumer.assigned == {0, 1} and sorted(assignment.offsets) == [0, 1]
    consumer.callback(assignment.on_assign, everything[2:], revoke=False)
    consumer.refuse_assign = True
    with pytest.raises(KafkaException):
        assignment._assign_waiting(consumer, offsets_read)  # type: ignore[arg-type]
    assert sorted(assignment.waiting) == [2, 3] and sorted(assignment.offsets) == [0, 1]
    consumer.callback(assignment.on_lost, everything, revoke=True)
    assert consumer.unassign_calls == [[0, 1]] and not consumer.assigned, consumer.unassign_calls
    assert not assignment.offsets and not assignment.waiting
