"""Offset commits made by a queue's poll thread for the group committer.

A transaction that wrote nothing commits its offsets with the queue consumer's own offset commit
(kafka/txn/offset_commit.py). confluent-kafka lets one thread at a time into a consumer: a call
from another thread waits while the poll thread is inside consume(), and the poll loop, back in
consume() at once, kept the committer out for more than 10 s. So the committer hands the commit
here and the poll thread makes it between two polls (see below), or while a revocation waits
for the committer (inside the rebalance callback, where the partitions are still this process's).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

Pending = tuple[list[TopicPartition], Callable[[], bool], "concurrent.futures.Future[list[TopicPartition]]"]


class PollCommits:
    """The commits waiting for the poll thread, in the order they were handed over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: collections.deque[Pending] = collections.deque()
        self._closed = False
        self._handed = threading.Event()  # set by submit(), cleared by serve()

    def submit(
        self, offsets: list[TopicPartition], still_ours: Callable[[], bool]
    ) -> concurrent.futures.Future[list[TopicPartition]]:
        """A commit of `offsets` for the poll thread; `still_ours()` is asked just before it is
        made (under the receiver's lock): False fails it uncommitted, as a partition revoked since
        the committer took its offsets must not have them committed by this process."""
        future: concurrent.futures.Future[list[TopicPartition]] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                future.set_exception(RuntimeError("the queue's consumer is closed"))
            else:
                self._pending.append((offsets, still_ours, future))
        self._handed.set()
        return future

    def waiting(self) -> bool:
        """Whether a commit waits for the poll thread."""
        return bool(self._pending)

    def wait(self, seconds: float) -> None:
        """Wait up to `seconds` for a commit to be handed over (at once if one waits)."""
        if not self._pending:
            self._handed.wait(seconds)

    def serve(self, consumer: Consumer, cv: Any) -> None:
        """Make the waiting commits, on the poll thread (the consumer's one caller)."""
        self._handed.clear()  # before taking them: one handed over after this sets it again
        while True:
            with self._lock:
                if not self._pending:
                    return
                offsets, still_ours, future = self._pending.popleft()
            with cv:
                ours = still_ours()
            if not ours:
                error = KafkaError(KafkaError.ILLEGAL_GENERATION, "the partition moved to another reader")
                future.set_exception(KafkaException(error))
                continue
            try:
                future.set_result(consumer.commit(offsets=offsets, asynchronous=False) or [])
            except Exception as exc:  # noqa: BLE001 - the committer reads it from the future
                future.set_exception(exc)

    def close(self) -> None:
        """Fail what still waits: the consumer is closing."""
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending), collections.deque()
        self._handed.set()
        for _offsets, _ours, future in pending:
            future.set_exception(RuntimeError("the queue's consumer is closed"))
