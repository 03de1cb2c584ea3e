"""RECEIVE outside a transaction, tried again when a rebalance fenced its commit.

Such a RECEIVE commits before it returns, so the caller has seen none of its messages when the
commit fails. Kafka refuses the consumed offsets of a transaction sent with the queue group's
previous generation (another reader joined or left while it was open): the messages are on the
queue again, and the next try, once the receiver's poll has the group's new generation, normally
commits. So the SDK tries again a few times within what is left of the wait rather than hand the
caller an error for a reader it never saw (an explicit transaction still gets
RebalanceAbortedError: it holds the application's work, which only the application can redo).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from kbroker.errors import RebalanceAbortedError

log = logging.getLogger("kbroker.sdk")
T = TypeVar("T")

# Tries after the first, and the pause before each (a queue consumer heartbeats every 0.2 s:
# kafka/receive/group_protocol.py, so its poll has the new generation by then).
RETRIES, PAUSE = 3, 0.2


def receive_fenced_again(receive: Callable[[float | None], T], wait: float | None, queue: str) -> T:
    """`receive(wait left)`, tried again after a RebalanceAbortedError, at most RETRIES times."""
    deadline = None if wait is None else time.monotonic() + wait
    attempt = 0
    while True:
        try:
            return receive(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except RebalanceAbortedError:
            if attempt == RETRIES:
                raise
            attempt += 1
            log.info("RECEIVE on %s fenced by its group's rebalance; receiving again", queue)
            time.sleep(PAUSE)
