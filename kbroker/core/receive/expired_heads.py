"""The expired head of a partition: what a purge at start-up may remove (pure: no Kafka client,
no threads, no clock; the receiver calls it under its own lock).

NServiceBus's SQL Server transport can purge expired messages when an endpoint starts
(PurgeExpiredMessagesOnStartup). A Kafka partition is only ever trimmed from its start, and its
committed offset only moves past a record once everything below it completed, so the purge can
remove only the run of expired records at the head of each partition: from the lowest offset not
completed up to the first record that is live. Expired records behind a live one stay; a receive
removes them as it reaches them.

The run is read over the partition's incomplete offsets, in order, never over a gap: a record
that is incomplete and not available to take (another transaction holds it, a dead letter of it
is on its way, or it is not the head of its group) ends the run, and so does a live one. Nothing
live is ever taken, and nothing is taken past a record that was not looked at.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar


class Expiring(Protocol):
    """A buffered record as the run reads it (core/receive/group_buffer.Buffered is one)."""

    def live(self, now_ms: int) -> bool: ...


R = TypeVar("R", bound=Expiring)


class Head(enum.Enum):
    """Where a partition's run ended, and so what is known of the partition's head."""

    LIVE = "live"  # at a live record: the head is live, the partition is done
    OPEN = "open"  # every incomplete record fetched was expired (or the batch is full): read on
    BUSY = "busy"  # at a record not available to take now: look again once it is


def expired_head(
    incomplete: Sequence[int], available: Mapping[int, R], now_ms: int, limit: int
) -> tuple[list[R], Head]:
    """The expired records at the head of one partition, at most `limit`, in offset order, and
    where the run ended. `incomplete`: the partition's incomplete offsets, ascending, from its
    lowest (at least `limit` + 1 of them when it has that many); `available`: the records that
    may be taken, by offset (buffered, not taken, the head of an unlocked group)."""
    taken: list[R] = []
    for offset in incomplete:
        if len(taken) >= limit:
            return taken, Head.OPEN
        record = available.get(offset)
        if record is None:
            return taken, Head.BUSY
        if record.live(now_ms):
            return taken, Head.LIVE
        taken.append(record)
    return taken, Head.OPEN


def head_settled(head: Head, taken: int, at_end: bool) -> bool:
    """Whether the purge is done with a partition: its head is live, or nothing expired was left
    to take and the consumer has read it to its end (an empty partition, or one whose every
    record the purge has removed)."""
    return head is Head.LIVE or (head is Head.OPEN and taken == 0 and at_end)
