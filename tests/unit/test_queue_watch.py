"""QueueWatcher.counts against stand-in clients: what it does with the answers Kafka gives a queue
created a moment ago (the real counts are tested in tests/integration/test_counting_clients.py)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.errors import KBrokerError
from kbroker.kafka.activation.watch import QueueWatcher


class StandInConsumer:
    """Answers each partition's watermarks with the errors given first, then (0, 0); counts the
    topic's lookups (a refused ask is followed by one, to learn a new leader)."""

    def __init__(self, *errors: int) -> None:
        self.errors, self.asked, self.looked_up = list(errors), 0, 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.looked_up += 1

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 0, 0


class StandInClients:
    def __init__(self, consumer: StandInConsumer) -> None:
        self.consumer = consumer

    def partitions(self, topic: str, timeout: float) -> list[int]:
        return [0, 1]

    def committed(self, group: str, partitions: list[TopicPartition], seconds: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]

    @contextmanager
    def scanner(self) -> Iterator[Any]:
        yield self.consumer


def watcher(consumer: StandInConsumer) -> QueueWatcher:
    return QueueWatcher("127.0.0.1:1", "ns", "Q", clients=StandInClients(consumer))  # type: ignore[arg-type]


def test_a_queue_not_led_yet_is_asked_again_until_it_is() -> None:
    """A fresh-clone run failed 'counting queue Q0000: ... Not leader for partition' right after
    the queue's topic was created."""
    consumer = StandInConsumer(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    counts = watcher(consumer).counts(timeout=10)
    assert (counts.backlog, counts.ready_groups, counts.exact) == (0, 0, True)
    assert consumer.asked == 4  # two refusals, then each partition once
    assert consumer.looked_up == 2  # after each refusal


def test_a_queue_that_stays_unled_is_a_typed_error_at_the_deadline() -> None:
    consumer = StandInConsumer(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KBrokerError, match="Not leader|not leader|NOT_LEADER"):
        watcher(consumer).counts(timeout=0.5)
    assert 2 <= consumer.asked < 20  # every 0.1 s, not spinning
