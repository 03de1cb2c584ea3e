"""clients.produce_within, the SDK's produce for statements outside a transaction: it waits while
librdkafka's local queue is full and, past its deadline, fails with the SDK's retriable
SendFailedError (never a raw BufferError); a queue that drains in time loses nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kbroker.errors import SendFailedError
from kbroker.kafka.clients import produce_within


class FullQueue:
    """A producer whose local queue stays full for `full_for` seconds."""

    def __init__(self, full_for: float) -> None:
        self.until = time.monotonic() + full_for
        self.produced: list[tuple[str, dict[str, Any]]] = []
        self.polls = 0

    def produce(self, topic: str, **kwargs: Any) -> None:
        if time.monotonic() < self.until:
            raise BufferError("Local: Queue full")
        self.produced.append((topic, kwargs))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        time.sleep(timeout)
        return 0


def test_a_queue_that_stays_full_fails_with_a_retriable_send_error() -> None:
    producer = FullQueue(full_for=60)
    start = time.monotonic()
    with pytest.raises(SendFailedError, match="within 0.2 s") as raised:
        produce_within(producer, "t", 0.2, key=b"k", value=b"v")  # type: ignore[arg-type]
    assert 0.2 <= time.monotonic() - start < 2.0
    assert raised.value.retriable and producer.produced == [] and producer.polls > 0


def test_a_queue_that_drains_in_time_takes_the_message() -> None:
    producer = FullQueue(full_for=0.1)
    produce_within(producer, "t", 5.0, key=b"k", value=b"v")  # type: ignore[arg-type]
    assert producer.produced == [("t", {"key": b"k", "value": b"v"})]
