"""reader.group_offsets over a fake consumer: one request for every partition when the
coordinator answers; when that times out (a still-open transaction holds one partition's
offsets), each partition alone, so the others are told and the held one comes back Unread with
its error; a refusal, or no partition answering at all, raises for the caller to retry."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.kafka.snapshot import Unread, group_offsets, without_errors

TOPIC = "kbroker.ns.queue.Q"


class FakeReader:
    """committed() answers from `offsets`; partitions in `held` time out, as does any request
    naming one of them; `refuse` fails every request with that error code."""

    def __init__(self, offsets: dict[int, int], held: set[int] = frozenset(), refuse: int | None = None):
        self.offsets, self.held, self.refuse = offsets, held, refuse
        self.requests: list[list[int]] = []

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        asked = [tp.partition for tp in tps]
        self.requests.append(asked)
        if self.refuse is not None:
            raise KafkaException(KafkaError(self.refuse))
        if any(p in self.held for p in asked):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(TOPIC, p, self.offsets[p]) for p in asked]


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


def test_one_request_when_the_coordinator_answers() -> None:
    reader = FakeReader({0: 5, 1: 7})
    got = group_offsets(reader, tps(0, 1), 5)  # type: ignore[arg-type]
    assert [(tp.partition, tp.offset, tp.error) for tp in got] == [(0, 5, None), (1, 7, None)]
    assert reader.requests == [[0, 1]]


def test_a_held_partition_does_not_keep_the_others_from_being_told() -> None:
    reader = FakeReader({0: 5, 1: 7, 2: 9}, held={1})
    got = group_offsets(reader, tps(0, 1, 2), 5)  # type: ignore[arg-type]
    assert [(tp.partition, tp.offset) for tp in got] == [(0, 5), (1, -1001), (2, 9)]
    assert isinstance(got[1], Unread) and got[1].error.code() == KafkaError._TIMED_OUT
    assert got[0].error is None and got[2].error is None
    assert reader.requests == [[0, 1, 2], [0], [1], [2]]
    with pytest.raises(KafkaException):
        without_errors(got)  # an in-doubt commit is never settled from a partition that was not told


def test_a_refusal_raises_at_once() -> None:
    reader = FakeReader({0: 5, 1: 7}, refuse=KafkaError.NOT_COORDINATOR)
    with pytest.raises(KafkaException) as info:
        group_offsets(reader, tps(0, 1), 5)  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError.NOT_COORDINATOR and reader.requests == [[0, 1]]


def test_nothing_answering_raises_rather_than_every_partition_unread() -> None:
    reader = FakeReader({0: 5, 1: 7}, held={0, 1})
    with pytest.raises(KafkaException) as info:
        group_offsets(reader, tps(0, 1), 5)  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError._TIMED_OUT


def test_no_admin_client_reads_committed_offsets() -> None:
    """An admin client's ListConsumerGroupOffsets kills the process when the coordinator answers
    NOT_COORDINATOR (librdkafka issue 5040): kbroker does not call it anywhere."""
    from pathlib import Path

    import kbroker

    root = Path(kbroker.__file__).parent
    callers = [str(p.relative_to(root)) for p in root.rglob("*.py") if "list_consumer_group_offsets(" in p.read_text()]
    assert callers == []
