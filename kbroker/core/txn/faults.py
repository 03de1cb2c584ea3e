"""What to do when a Kafka transaction fails or overruns its deadline: pure decisions, no I/O.

The committer runs each librdkafka transaction call (init, begin, produce, send offsets, commit,
abort) on a helper thread and stops waiting at a deadline it enforces itself, because librdkafka
does not always honour the timeout it is given (send_offsets_to_transaction can block for ever
after a broker restart). This module decides, from the stage a call failed in and what the error
says, what the committer does next, and whether the transaction can have committed.

Why replacing a producer is safe (nothing commits twice, nothing is lost):
- A Kafka transaction commits only if its producer asked the coordinator to commit it
  (commit_transaction). Before that stage a failed or stuck transaction can only end aborted:
  the committer never calls anything on an abandoned producer again, and Kafka aborts the open
  transaction when a new producer with the same transactional.id initialises (or after
  transaction.timeout.ms). So its requests fail with a retriable error at once and their
  messages go back, in order, to the head of their groups.
- Once commit_transaction was called and did not answer, the outcome is in doubt: the
  coordinator may have written the commit decision. A new producer with the same
  transactional.id settles it: its init_transactions returns only after the coordinator finished
  the old transaction, committed (if the decision was written) or aborted. The committed consumer
  offsets then tell which: the transaction carried them, so they equal what it sent if and only
  if it committed (each transaction completes offsets no earlier one did, so its positions differ
  from every earlier commit's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable


class Stage(Enum):
    """The call of a Kafka transaction that failed."""

    INIT = "init_transactions"
    BEGIN = "begin_transaction"
    PRODUCE = "produce"
    OFFSETS = "send_offsets_to_transaction"
    COMMIT = "commit_transaction"
    ABORT = "abort_transaction"


class Action(Enum):
    """What the committer does after a failure."""

    RETRY_COMMIT = "retry commit"  # commit_transaction failed retriably: librdkafka says ask again
    ABORT = "abort"  # abort on the same producer; the transaction did not commit
    REPLACE = "replace"  # abandon the producer; the transaction did not commit
    RESOLVE = "resolve"  # abandon the producer; the outcome is in doubt until a new one fences it


@dataclass(frozen=True)
class Failure:
    """A failed call: its stage, whether kbroker's deadline ran out (the call may still be
    running), and librdkafka's classification of the error, if there was one."""

    stage: Stage
    timed_out: bool = False
    fatal: bool = False
    retriable: bool = False
    requires_abort: bool = False


def decide(failure: Failure, time_left: float) -> Action:
    """The next step after `failure`, with `time_left` seconds of the transaction's budget."""
    if failure.stage in (Stage.INIT, Stage.ABORT):
        return Action.REPLACE  # a producer that cannot start or abort is not used again
    if failure.stage is not Stage.COMMIT:
        # The commit was never requested: whatever happens to this producer, nothing commits.
        return Action.REPLACE if failure.timed_out or failure.fatal else Action.ABORT
    if failure.timed_out or failure.fatal:
        return Action.RESOLVE  # the commit request may have reached the coordinator
    if failure.requires_abort:
        return Action.ABORT  # the coordinator refused the commit
    if failure.retriable and time_left > 0:
        return Action.RETRY_COMMIT
    return Action.RESOLVE


Position = tuple[str, int, int, str | None]  # (topic, partition, offset, metadata)


def committed_by_offsets(sent: list[Position], found: list[Position]) -> bool:
    """Whether an in-doubt transaction committed, from the offsets it sent and the group's
    committed offsets read after a new producer fenced it: all of them match, or none do."""
    if not sent:
        raise ValueError("a transaction without offsets cannot be settled by its offsets")
    have = {(t, p): (o, m or None) for t, p, o, m in found}
    return all(have.get((t, p)) == (o, m or None) for t, p, o, m in sent)


class Deadline:
    """A point in time a sequence of calls must finish by (monotonic clock)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.at = clock() + seconds

    def left(self) -> float:
        """Seconds until the deadline (0 once it passed)."""
        return max(self.at - self._clock(), 0.0)

    def expired(self) -> bool:
        """Whether the deadline passed."""
        return self.left() <= 0.0

    def call_timeout(self, cap: float, floor: float = 0.1) -> float:
        """The timeout to give one call: what is left, at most `cap`, at least `floor` (a call
        given no time at all would fail without trying)."""
        return max(min(self.left(), cap), floor)
