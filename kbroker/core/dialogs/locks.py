"""SEND's conversation locks (Service Broker locks each conversation a SEND uses until the
transaction ends).

Without them, two transactions of a process sending on one dialog would both number their
message from the endpoint's committed send sequence, and could commit out of sequence order.
Owners are transactions (or a token for a statement outside one). Where Service Broker detects
deadlocks, a waiter here gives up after `timeout` with ConversationLockTimeoutError.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kbroker.errors import ConversationLockTimeoutError


class ConversationLocks:
    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self._holders: dict[str, object] = {}  # conversation handle -> owner
        self._mutex = threading.Lock()
        # The handles someone waits for: a release wakes only the waiters of the handles it
        # frees. One condition for all woke every waiting thread of the process at each release
        # (64 readers, for a lease keeper that released leases one by one).
        self._waiting: dict[str, _Waiters] = {}

    def lock(self, handle: str, owner: object) -> None:
        """Take the lock for `owner` (again is a no-op), waiting up to `timeout` for another
        owner to release it."""
        deadline = time.monotonic() + self.timeout
        with self._mutex:
            waiters: _Waiters | None = None  # this thread's place among the handle's waiters
            try:
                while True:
                    holder = self._holders.get(handle)
                    if holder is None or holder is owner:
                        self._holders[handle] = owner
                        return
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ConversationLockTimeoutError(handle, self.timeout)
                    waiters = waiters or self._join(handle)
                    waiters.cv.wait(left)
            finally:
                if waiters is not None:
                    waiters.count -= 1
                    if not waiters.count:
                        del self._waiting[handle]

    def _join(self, handle: str) -> "_Waiters":
        """Count this thread among `handle`'s waiters (under the mutex)."""
        waiters = self._waiting.get(handle)
        if waiters is None:
            waiters = self._waiting[handle] = _Waiters(threading.Condition(self._mutex))
        waiters.count += 1
        return waiters

    def try_lock(self, handle: str, owner: object) -> bool:
        """Take the lock for `owner` if nobody holds it, without waiting."""
        with self._mutex:
            if handle in self._holders:
                return False
            self._holders[handle] = owner
            return True

    def release(self, handles: Iterable[str], owner: object) -> None:
        with self._mutex:
            for handle in handles:
                if self._holders.get(handle) is owner:
                    del self._holders[handle]
                    waiters = self._waiting.get(handle)
                    if waiters is not None:
                        waiters.cv.notify()

    @contextmanager
    def held(self, handle: str) -> Iterator[None]:
        """For one statement outside a transaction: the lock while it runs."""
        owner = object()
        self.lock(handle, owner)
        try:
            yield
        finally:
            self.release([handle], owner)


@dataclass(eq=False)
class _Waiters:
    """The threads waiting for one conversation's lock."""

    cv: threading.Condition
    count: int = 0
