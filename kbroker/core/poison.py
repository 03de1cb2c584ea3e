"""Poison-message handling: a queue whose RECEIVEs are rolled back five times in a row is
disabled (STATUS = OFF), as in Service Broker, unless its POISON_MESSAGE_HANDLING is OFF.

This is the policy only: the counting and the verdict (which queue to disable, and the reason
to report with the event). Disabling the queue (an event and a catalog record) is the caller's
I/O."""

from __future__ import annotations

from dataclasses import dataclass

POISON_THRESHOLD = 5  # consecutive rolled-back receives that disable a queue, as in Service Broker


@dataclass(frozen=True)
class DisableQueue:
    """The verdict that `queue` must be disabled now, after `rollbacks` rolled-back receives in a
    row; `reason` is what the queue-disabled event reports."""

    queue: str
    rollbacks: int

    @property
    def reason(self) -> str:
        """Why the queue was disabled, as the event reports it."""
        return f"{self.rollbacks} consecutive rolled-back receives"


class PoisonCounter:
    """Per queue, the rolled-back RECEIVEs since the last commit or re-enabling.

    Only watched queues count: a process counts a queue once it reads it itself (its primary
    queue, not only a secondary queue of it), and forgets every count when it stops reading."""

    def __init__(self, threshold: int = POISON_THRESHOLD):
        self.threshold = threshold
        self._counts: dict[str, int] = {}

    def watch(self, queue: str) -> None:
        """Start counting `queue` (from zero, unless it is already counted)."""
        self._counts.setdefault(queue, 0)

    def watches(self, queue: str) -> bool:
        """Whether rollbacks of `queue` are counted here."""
        return queue in self._counts

    def count(self, queue: str) -> int:
        """The consecutive rolled-back receives of `queue` so far (0 when not watched)."""
        return self._counts.get(queue, 0)

    def reset(self, queue: str) -> None:
        """A receive of `queue` committed, or the queue was enabled again: start over."""
        if queue in self._counts:
            self._counts[queue] = 0

    def rolled_back(self, queue: str, poison_message_handling: bool) -> DisableQueue | None:
        """Count a rolled-back receive of a watched `queue`. Returns the verdict when the queue
        must be disabled now (at the threshold and every rollback after it, while handling is
        on: a queue enabled again by another process is disabled again), else None."""
        if queue not in self._counts:
            return None
        self._counts[queue] += 1
        count = self._counts[queue]
        if poison_message_handling and count >= self.threshold:
            return DisableQueue(queue, count)
        return None

    def forget_all(self) -> None:
        """Stop counting every queue (the process no longer reads them)."""
        self._counts.clear()
