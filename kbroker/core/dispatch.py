"""The dispatcher's every-tick sweep of its buffered messages (pure logic).

Seed 000: on every tick the message dispatcher deletes out-of-order and stale messages from its
in-memory per-dialog buffers; stale means not picked up within 10 s of arriving. The sender keeps
every unacknowledged message and retransmits it, so dropping costs a resend, never a message.

Per conversation, what may stay is the run of consecutive sequence numbers starting at the one
the conversation expects next (new conversations expect 0, the first sequence number kbroker
sends). Dropped are:
  duplicate     sequence below the expected one (already delivered), or another copy of one
                kept (the earliest fresh copy is kept);
  out_of_order  sequence past a gap: it cannot be delivered before the missing one, which will
                come back by retransmission, and this one with it;
  stale         buffered `stale_after` seconds (10 s) or more ago. A stale expected message with
                no fresh copy leaves a gap, so whatever follows it is out of order too.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import Any

STALE_AFTER_SECONDS = 10.0  # seed 000


class DropReason(str, enum.Enum):
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    STALE = "stale"


@dataclass(frozen=True)
class Buffered:
    conversation: str  # conversation handle (the dialog the buffer belongs to)
    sequence: int  # message_sequence_number
    buffered_at: float
    ref: Any = None  # whatever the adapter needs to find the message (offset, message id)


@dataclass(frozen=True)
class Sweep:
    keep: tuple[Buffered, ...]  # in delivery order per conversation
    drop: tuple[tuple[Buffered, DropReason], ...]


def sweep(
    buffered: Iterable[Buffered],
    expected: Mapping[str, int],
    now: float,
    stale_after: float = STALE_AFTER_SECONDS,
) -> Sweep:
    """Which buffered messages stay and which go, as of `now`."""
    by_conv: dict[str, list[Buffered]] = defaultdict(list)
    for b in buffered:
        by_conv[b.conversation].append(b)
    keep: list[Buffered] = []
    drop: list[tuple[Buffered, DropReason]] = []
    for conv, msgs in by_conv.items():
        nxt = expected.get(conv, 0)
        msgs.sort(key=lambda m: (m.sequence, m.buffered_at))
        for seq, group in groupby(msgs, key=lambda m: m.sequence):
            copies = list(group)
            if seq < nxt:
                drop.extend((b, DropReason.DUPLICATE) for b in copies)
                continue
            if seq > nxt:  # past a gap, or past an expected message lost to staleness
                drop.extend((b, DropReason.OUT_OF_ORDER) for b in copies)
                continue
            # The expected one: keep the earliest fresh copy (a retransmission may be fresher).
            fresh = [b for b in copies if now - b.buffered_at < stale_after]
            drop.extend((b, DropReason.STALE) for b in copies if now - b.buffered_at >= stale_after)
            if not fresh:
                continue  # nxt stays: everything after it is now out of order
            keep.append(fresh[0])
            drop.extend((b, DropReason.DUPLICATE) for b in fresh[1:])
            nxt += 1
    return Sweep(tuple(keep), tuple(drop))


class Inbox:
    """The dispatcher's per-direction state: the next sequence number each dialog direction
    expects (what the acks topic says) and the messages that arrived ahead of it.

    `offer` returns what can be saved now, in order: the message if it is the expected one, and
    then any buffered successors it unblocks. `checkpoint`/`restore` undo the offers of a batch
    whose transaction failed (its records are read again)."""

    def __init__(self, max_buffered: int = 10_000) -> None:
        self.expected: dict[str, int] = {}
        self.buffered: list[Buffered] = []
        self.max_buffered = max_buffered

    def offer(self, key: str, sequence: int, now: float, ref: Any) -> tuple[list[Any], DropReason | None]:
        """(refs to save now in order, why `ref` was dropped or None)."""
        nxt = self.expected.get(key, 0)
        if sequence < nxt:
            return [], DropReason.DUPLICATE
        if sequence > nxt:
            if len(self.buffered) >= self.max_buffered:
                return [], DropReason.OUT_OF_ORDER  # the sender sends it again
            self.buffered.append(Buffered(key, sequence, now, ref))
            return [], None
        out = [ref]
        nxt += 1
        while True:
            ahead = [b for b in self.buffered if b.conversation == key and b.sequence == nxt]
            if not ahead:
                break
            self.buffered = [b for b in self.buffered if not (b.conversation == key and b.sequence <= nxt)]
            out.append(ahead[0].ref)
            nxt += 1
        self.expected[key] = nxt
        return out, None

    def sweep(self, now: float, stale_after: float = STALE_AFTER_SECONDS) -> tuple[tuple[Buffered, DropReason], ...]:
        """The every-tick sweep over what is buffered (see `sweep`)."""
        result = sweep(self.buffered, self.expected, now, stale_after)
        self.buffered = list(result.keep)
        return result.drop

    def checkpoint(self) -> tuple[dict[str, int], list[Buffered]]:
        return dict(self.expected), list(self.buffered)

    def restore(self, saved: tuple[dict[str, int], list[Buffered]]) -> None:
        self.expected, self.buffered = dict(saved[0]), list(saved[1])
