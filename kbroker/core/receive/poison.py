"""Poison-message handling: a queue whose RECEIVEs are rolled back five times in a row is
disabled (STATUS = OFF), as in Service Broker, unless its POISON_MESSAGE_HANDLING is OFF.

Two counts, either of which disables the queue:
- PoisonCounter: the rolled-back receives in a row of one process (Service Broker's rule as
  one process sees it; any commit of that process starts it over).
- RollbackLedger: the rollbacks of each message, by whichever process took it. Every process
  publishes its rollbacks and follows the others' (kafka/receive/rollbacks.py), so a poison message
  that moves to another reader, or that busy readers' commits of other messages would keep
  resetting in a per-queue count, still disables its queue at its fifth rollback.

This is the policy only: the counting and the verdict (which queue to disable, and the reason
to report with the event). Publishing rollbacks and disabling the queue are the caller's I/O."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

POISON_THRESHOLD = 5  # consecutive rolled-back receives that disable a queue, as in Service Broker


@dataclass(frozen=True)
class DisableQueue:
    """The verdict that `queue` must be disabled now, after `rollbacks` rolled-back receives in a
    row; `reason` is what the queue-disabled event reports."""

    queue: str
    rollbacks: int
    message: str | None = None  # "partition:offset" of a message rolled back that many times

    @property
    def reason(self) -> str:
        """Why the queue was disabled, as the event reports it."""
        if self.message is not None:
            return f"the message at {self.message} was rolled back {self.rollbacks} times"
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


Position = tuple[str, int, int]  # (topic, partition, offset) of a message


class RollbackLedger:
    """Rollbacks per message, from every process: this one's and those it read of others.
    Bounded: past `limit` messages the least recently counted are forgotten (a poison message
    is retried within seconds, so it is never the one forgotten)."""

    def __init__(self, limit: int = 100_000):
        self._limit = limit
        self._counts: OrderedDict[Position, int] = OrderedDict()

    def count(self, position: Position) -> int:
        return self._counts.get(position, 0)

    def rolled_back(self, positions: Iterable[Position]) -> dict[Position, int]:
        """One more rollback of each message; their counts now."""
        return {p: self._set(p, self.count(p) + 1) for p in positions}

    def seen(self, position: Position, count: int) -> None:
        """Another process (or this one, read back) counted `count` rollbacks of a message."""
        if count > self.count(position):
            self._set(position, count)

    def forget(self, positions: Iterable[Position]) -> None:
        """The messages were received by a committed transaction: they are gone."""
        for p in positions:
            self._counts.pop(p, None)

    def verdict(
        self, queue: str, counts: dict[Position, int], poison_message_handling: bool, threshold: int = POISON_THRESHOLD
    ) -> DisableQueue | None:
        """Disable `queue` when one of the messages just rolled back reached the threshold."""
        if not poison_message_handling or not counts:
            return None
        (_, partition, offset), worst = max(counts.items(), key=lambda kv: kv[1])
        return DisableQueue(queue, worst, f"{partition}:{offset}") if worst >= threshold else None

    def _set(self, position: Position, count: int) -> int:
        self._counts[position] = count
        self._counts.move_to_end(position)
        while len(self._counts) > self._limit:
            self._counts.popitem(last=False)
        return count


class EventDisables:
    """The queues disabled by a poison verdict that only the events topic carries: the process
    that reached it could not write the catalog (only its owner and ALTER's holders may, G7), so
    it published the verdict as a QUEUE_DISABLED event marked `"catalog": false`. Every reading
    process follows the events topic (kafka/receive/rollbacks.py) and refuses RECEIVE on such a queue
    until a later QUEUE_ENABLED of it (`kbroker queue enable` by an ALTER holder), which the
    queue's key keeps in order after the verdict. A verdict the catalog holds is the catalog's
    to undo, and not counted here."""

    def __init__(self) -> None:
        self._queues: set[str] = set()

    def seen(self, event: object) -> None:
        """An event of the events topic, as decoded (anything: other writers' records are not trusted)."""
        if not isinstance(event, dict) or not isinstance(event.get("queue"), str):
            return
        if event.get("event") == "QUEUE_DISABLED" and event.get("poison") is True and event.get("catalog") is False:
            self._queues.add(event["queue"])
        elif event.get("event") == "QUEUE_ENABLED":
            self._queues.discard(event["queue"])

    def disabled(self, queue: str) -> bool:
        return queue in self._queues
