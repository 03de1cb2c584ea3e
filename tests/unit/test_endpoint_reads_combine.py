"""Reads of the endpoints topic combine: a caller needs a read begun after it called (so what it
wrote before is in it); callers queued behind one read share the next instead of each reading
in turn (64 readers claiming leases at once read the topic 64 times, one after another)."""

from __future__ import annotations

import threading
import time

import pytest

from kbroker.errors import BrokerUnavailableError
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore


class CountedReads:
    """Stands in for one read of the topic to its end: takes `seconds`, counts when each began."""

    def __init__(self, seconds: float, fail: int = 0):
        self.seconds, self.fail = seconds, fail
        self.begun: list[float] = []

    def __call__(self, timeout: float) -> None:
        self.begun.append(time.monotonic())
        time.sleep(self.seconds)
        if self.fail:
            self.fail -= 1
            raise BrokerUnavailableError("the read failed")


def store_with(reads: CountedReads) -> EndpointStore:
    store = EndpointStore("127.0.0.1:1", "ns", None)
    store._reader._read_locked = reads  # type: ignore[method-assign]  # no broker: only the read's timing
    return store


def refresh_all(store: EndpointStore, callers: int) -> list[float]:
    """`callers` threads refresh at once; when each called."""
    called: list[float] = []
    start = threading.Barrier(callers)

    def call() -> None:
        start.wait()
        called.append(time.monotonic())
        store.refresh()

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return called


def test_callers_queued_behind_a_read_share_the_next_one() -> None:
    reads = CountedReads(0.2)
    store = store_with(reads)
    called = refresh_all(store, 16)
    assert len(called) == 16
    # One read (or two, if some callers came after the first one began), never one per caller.
    assert 1 <= len(reads.begun) <= 2, reads.begun


def test_every_caller_gets_a_read_begun_after_it_called() -> None:
    reads = CountedReads(0.05)
    store = store_with(reads)
    store.refresh()
    first = list(reads.begun)
    time.sleep(0.01)
    asked = time.monotonic()
    store.refresh()  # the read before this call does not count: its writes may be missing there
    assert len(reads.begun) == len(first) + 1 and reads.begun[-1] >= asked


def test_a_read_that_failed_is_not_shared() -> None:
    reads = CountedReads(0.1, fail=1)
    store = store_with(reads)
    errors: list[Exception] = []

    def first() -> None:
        try:
            store.refresh()
        except BrokerUnavailableError as exc:
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.03)  # the failing read is under way; this caller queues behind it
    store.refresh()
    t.join(5)
    assert len(errors) == 1
    assert len(reads.begun) == 2  # the caller behind the failed read read again


@pytest.mark.parametrize("callers", [4])
def test_reads_after_a_shared_one_begin_again(callers: int) -> None:
    reads = CountedReads(0.05)
    store = store_with(reads)
    refresh_all(store, callers)
    n = len(reads.begun)
    refresh_all(store, callers)
    assert n + 1 <= len(reads.begun) <= n + 2
