"""A transactional producer whose blocking calls kbroker bounds itself.

librdkafka does not always honour the timeout a transaction call is given: after a broker
restart, send_offsets_to_transaction has been seen to block for ever (librdkafka issues #5456,
#5511). A GuardedProducer runs every call on a thread of its own and stops waiting at the
deadline; the producer is then abandoned for good (a call may still be running inside it, so it
is never used again) and its thread drops it once that call returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import Any, Callable, TypeVar

from confluent_kafka import Producer

log = logging.getLogger("kbroker.committer")

T = TypeVar("T")

# librdkafka is given the call's timeout and kbroker waits this much longer, so a call that
# honours its timeout fails with librdkafka's own error (more telling) rather than kbroker's.
GRACE = 1.0


class CallDeadlineExceeded(Exception):
    """A producer call did not return by kbroker's deadline; the producer is abandoned."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"{what} did not return within {seconds:.1f} s")
        self.what = what


class GuardedProducer:
    """A librdkafka producer used only through call(), which waits at most a deadline."""

    def __init__(self, producer: Producer, name: str):
        self.name = name
        self._producer: Producer | None = producer
        self._calls: queue.Queue[tuple[Callable[[Producer], Any], concurrent.futures.Future[Any]] | None] = \
            queue.Queue()
        self.abandoned = False
        self._thread = threading.Thread(target=self._serve, name=f"kbroker-txn-{name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                break
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                assert self._producer is not None  # dropped only after the last call
                future.set_result(fn(self._producer))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
        # The last reference: librdkafka's destroy runs here, never on the committer's thread.
        self._producer = None

    def call(self, what: str, fn: Callable[[Producer], T], seconds: float) -> T:
        """fn(producer) on the producer's thread; its result or exception, or
        CallDeadlineExceeded (and the producer abandoned) after `seconds` + GRACE."""
        if self.abandoned:
            raise CallDeadlineExceeded(what, 0.0)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((fn, future))
        try:
            return future.result(timeout=seconds + GRACE)
        except concurrent.futures.TimeoutError:
            log.error("%s on transactional producer %s did not return within %.1f s: abandoning it",
                      what, self.name, seconds + GRACE)
            self.abandon()
            raise CallDeadlineExceeded(what, seconds + GRACE) from None

    def abandon(self) -> None:
        """Never use this producer again; its thread ends (and drops it) once any running call
        returns."""
        if not self.abandoned:
            self.abandoned = True
            self._calls.put(None)
