"""clients.consume_soon against a stand-in that waits the way librdkafka's consume() does:
until `num_messages` records are there or the timeout passes."""

from __future__ import annotations

import threading
import time
from typing import Any

from kbroker.kafka.clients import consume_soon

from .fake_consumer import FakeMessage


class WaitingConsumer:
    """Records arrive at given monotonic times; consume(n, timeout) returns once n of them
    have arrived or the timeout passed (then what has arrived), as librdkafka's batch consume."""

    def __init__(self, arrivals: list[float]):
        self._pending = sorted(arrivals)
        self._offset = 0
        self.calls: list[tuple[int, float]] = []

    def _take(self, most: int) -> list[FakeMessage]:
        now, out = time.monotonic(), []
        while self._pending and self._pending[0] <= now and len(out) < most:
            self._pending.pop(0)
            out.append(FakeMessage(0, self._offset))
            self._offset += 1
        return out

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.calls.append((num_messages, timeout))
        deadline = time.monotonic() + max(timeout, 0.0)
        out = self._take(num_messages)
        while len(out) < num_messages and time.monotonic() < deadline:
            time.sleep(0.002)
            out += self._take(num_messages - len(out))
        return out


def test_returns_as_soon_as_one_record_comes_not_after_the_whole_wait() -> None:
    consumer = WaitingConsumer([time.monotonic() + 0.05])
    t0 = time.monotonic()
    got = consume_soon(consumer, 500, 5.0)  # type: ignore[arg-type]  # a stand-in Consumer
    took = time.monotonic() - t0
    assert len(got) == 1
    assert took < 2.0, f"waited {took:.2f} s for one record: the whole wait, not the first record"


def test_takes_what_is_already_there_in_one_batch_without_waiting() -> None:
    now = time.monotonic()
    consumer = WaitingConsumer([now - 1] * 700)
    t0 = time.monotonic()
    got = consume_soon(consumer, 500, 5.0)  # type: ignore[arg-type]
    assert len(got) == 500 and time.monotonic() - t0 < 2.0
    assert consumer.calls[0] == (500, 0)  # the buffered batch first, without a wait


def test_after_the_first_record_it_adds_what_else_is_there() -> None:
    start = time.monotonic() + 0.05
    consumer = WaitingConsumer([start] * 3)
    got = consume_soon(consumer, 500, 5.0)  # type: ignore[arg-type]
    assert len(got) == 3  # the first by the waiting call, the two others by the one after it


def test_nothing_comes_it_waits_the_wait_and_returns_empty() -> None:
    consumer = WaitingConsumer([])
    t0 = time.monotonic()
    assert consume_soon(consumer, 500, 0.1) == []  # type: ignore[arg-type]
    assert time.monotonic() - t0 >= 0.09


def test_a_thread_blocked_in_it_wakes_when_a_record_arrives() -> None:
    consumer = WaitingConsumer([time.monotonic() + 0.1])
    done: list[float] = []
    t = threading.Thread(target=lambda: (consume_soon(consumer, 10, 10.0), done.append(time.monotonic())))  # type: ignore[arg-type]
    t0 = time.monotonic()
    t.start()
    t.join(5)
    assert done and done[0] - t0 < 3.0
