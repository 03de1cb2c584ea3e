"""read_partitions, the one read-to-end primitive, driven by a scripted consumer."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from kbroker.errors import KBrokerError
from kbroker.kafka.snapshot import PartitionsRead
from kbroker.kafka.snapshot import read_partitions as read_real

from .fake_consumer import FakeConsumer, FakeMessage, eof


def read_partitions(consumer: FakeConsumer, topic: str, starts: dict[int, int], timeout: float) -> PartitionsRead:
    """The real primitive, handed the scripted stand-in where it expects a Consumer."""
    return read_real(consumer, topic, starts, timeout)  # type: ignore[arg-type]  # a stand-in Consumer


def record(partition: int, offset: int) -> FakeMessage:
    return FakeMessage(partition, offset, key_=b"k", value_=f"{partition}/{offset}".encode())


def test_reads_each_partition_to_its_eof_and_reports_the_next_positions() -> None:
    # Partition 1's end (EOF at 4) is past its last record (2): a transaction marker took offset 3.
    consumer = FakeConsumer(
        {0: (0, 2), 1: (0, 4)}, [[record(0, 0), record(1, 2)], [record(0, 1), eof(0, 2)], [eof(1, 4)]]
    )
    read = read_partitions(consumer, "t", {0: 0, 1: 2}, timeout=5)
    assert [m.value() for m in read.records] == [b"0/0", b"1/2", b"0/1"]
    assert read.positions == {0: 2, 1: 4}
    assert read.unfinished == set()
    assert sorted(consumer.assigned) == [(0, 0), (1, 2)]
    assert consumer.unassigned == 1


def test_partitions_with_nothing_new_are_not_assigned() -> None:
    consumer = FakeConsumer({0: (0, 7), 1: (0, 3)}, [[eof(0, 7)]])
    read = read_partitions(consumer, "t", {0: 5, 1: 3}, timeout=5)
    assert consumer.assigned == [(0, 5)]
    assert read.positions == {0: 7, 1: 3}


def test_an_offset_below_the_log_start_reads_from_the_log_start() -> None:
    # Assigning an offset retention already deleted would reset to the end and skip everything.
    consumer = FakeConsumer({0: (10, 12)}, [[record(0, 10), record(0, 11), eof(0, 12)]])
    read = read_partitions(consumer, "t", {0: 0}, timeout=5)
    assert consumer.assigned == [(0, 10)]
    assert len(read.records) == 2


def test_what_is_not_reached_by_the_deadline_is_reported_unfinished() -> None:
    consumer = FakeConsumer({0: (0, 9)}, [[record(0, 0)]])
    read = read_partitions(consumer, "t", {0: 0}, timeout=0.3)
    assert read.unfinished == {0}
    assert read.positions == {0: 1}
    assert consumer.unassigned == 1


def test_an_error_raises_a_typed_error_and_unassigns() -> None:
    consumer = FakeConsumer({0: (0, 9)}, [[FakeMessage(0, 0, error_=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))]])
    with pytest.raises(KBrokerError, match="reading t failed"):
        read_partitions(consumer, "t", {0: 0}, timeout=5)
    assert consumer.unassigned == 1
