"""What a transaction hands the group committer (committer.py): a CommitRequest, its records and
its receive leases, and the outcome the waiting transaction learns.

Apart from the batch loop: a transaction builds its request knowing nothing of the committer's
producers (sdk/transaction.py imports only this).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from kbroker.core.records import Record

log = logging.getLogger("kbroker.committer")


class Lease(Protocol):
    """What the committer needs of a receive lease (kafka/receive/receive_leases.Lease): the
    receiver whose offsets it completes, and whether a rebalance doomed it."""

    receiver: Any
    doomed: bool


@dataclass(eq=False)
class CommitRequest:
    """One transaction's commit: its records to produce and its leases' offsets to commit."""

    records: list[Record]
    leases: Sequence[Lease]
    # The committer's generation when the transaction first took a conversation lease (None:
    # it took none). A producer created since may postdate a fence meant for this process.
    generation: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    committed_at: float = 0.0
    # Called with the request once it has its outcome, on the committer's thread: it must not
    # wait (it may submit another request).
    then: Callable[["CommitRequest"], None] | None = None

    def finish(self, error: Exception | None) -> None:
        """Tell the waiting transaction the outcome (None: committed)."""
        self.error, self.committed_at = error, time.time()
        self.done.set()
        if self.then is not None:
            try:
                self.then(self)
            except Exception:  # logged with its traceback: the committer's thread must go on committing
                log.exception("a commit request's follow-up failed")


def refused_requests(batch: list[CommitRequest], refused: dict[int, str]) -> dict[CommitRequest, str]:
    """The requests of `batch` that hold a record Kafka refused (`refused`: index of the record
    in the batch's records, as the transaction produced them, -> why), with the first why."""
    out: dict[CommitRequest, str] = {}
    start = 0
    for req in batch:
        end = start + len(req.records)
        why = next((refused[i] for i in range(start, end) if i in refused), None)
        if why is not None:
            out[req] = why
        start = end
    return out
