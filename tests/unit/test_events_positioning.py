"""The external activator's events reader fixes its start positions in the assignment callback,
before it says it is ready (a fake consumer, no broker). A question that fails (a just-started
broker's group coordinator still loading) is asked again: falling back at once to a lazy
"latest" skipped the events written between `ready` and the first fetch."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.kafka.activation.events import EventsReader

TOPIC = "kbroker.t.events"


class Consumer:
    def __init__(self, failures: int, committed_offset: int = -1001, end: int = 7) -> None:
        self.failures, self.committed_offset, self.end = failures, committed_offset, end
        self.assigned: list[tuple[int, int]] | None = None
        self.commits: list[list[tuple[int, int]]] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self.end

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in partitions]


def reader(events: list[str]) -> EventsReader:
    r = EventsReader.__new__(EventsReader)  # no broker: only the callback is exercised
    r.topic = TOPIC
    r._on_ready = lambda: events.append("ready")
    r._on_error = lambda text: events.append(f"error: {text}")
    return r


def assign(consumer: Any, events: list[str]) -> None:
    reader(events)._on_assign(consumer, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])


def test_a_failed_question_is_asked_again_and_ready_comes_once_positioned() -> None:
    consumer, events = Consumer(failures=2), []
    assign(consumer, events)
    assert consumer.assigned == [(0, 7), (1, 7)], "positioned at the end as of the assignment"
    assert consumer.commits == [[(0, 7), (1, 7)]], "and that position committed"
    assert events == ["ready"]


def test_a_committed_position_is_where_reading_resumes() -> None:
    consumer, events = Consumer(failures=0, committed_offset=3), []
    assign(consumer, events)
    assert consumer.assigned == [(0, 3), (1, 3)] and consumer.commits == []
    assert events == ["ready"]
