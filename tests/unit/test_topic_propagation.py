"""A topic created a moment ago may look missing on the broker a client asks first: the
existence check asks again for a bounded grace before it calls the topic missing."""

from __future__ import annotations

import time
from types import SimpleNamespace

from kbroker.kafka.topic_propagation import partitions_after_propagation


class LearningBroker:
    """Answers metadata requests as a broker that learns of `topic` after `lag` seconds."""

    def __init__(self, topic: str, lag: float) -> None:
        self.topic, self.known_at, self.asked = topic, time.monotonic() + lag, 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> SimpleNamespace:
        self.asked += 1
        topics = {}
        if time.monotonic() >= self.known_at:
            topics[self.topic] = SimpleNamespace(error=None, partitions={0: None, 1: None})
        return SimpleNamespace(topics=topics)


def test_a_topic_learned_late_is_found() -> None:
    broker = LearningBroker("kbroker.ns.catalog", lag=0.5)
    assert partitions_after_propagation(broker, "kbroker.ns.catalog", timeout=30, grace=5) == [0, 1]  # type: ignore[arg-type]
    assert broker.asked >= 2


def test_a_missing_topic_is_missing_after_the_grace_and_no_later() -> None:
    broker = LearningBroker("kbroker.ns.catalog", lag=3600)
    started = time.monotonic()
    assert partitions_after_propagation(broker, "kbroker.ns.catalog", timeout=30, grace=0.6) is None  # type: ignore[arg-type]
    assert 0.6 <= time.monotonic() - started < 2.0


def test_the_grace_never_outlasts_the_callers_timeout() -> None:
    broker = LearningBroker("kbroker.ns.catalog", lag=3600)
    started = time.monotonic()
    assert partitions_after_propagation(broker, "kbroker.ns.catalog", timeout=0.3, grace=5) is None  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.5
