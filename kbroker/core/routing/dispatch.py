"""The dispatcher's every-tick sweep of its buffered messages (pure logic).

Seed 000: on every tick the message dispatcher deletes out-of-order and stale messages from its
in-memory per-dialog buffers; stale means not picked up within 10 s of arriving. The sender keeps
every unacknowledged message and retransmits it, so dropping costs a resend, never a message.

Per conversation, what may stay is the run of messages that can be saved one after another starting
at the number the conversation expects next (new conversations expect 0, the first sequence number
kbroker sends). A message is next in line when its number is the expected one, or when its sender
declared that nothing unsaved comes between: `follows`, the number of the message before it on its
direction as the sending transmitter knew it (-1: every earlier message was acknowledged), is below
the expected number. Sequence numbers may jump: a send lease claimed after its holder died starts at
the dead holder's ceiling (docs/endpoints.md), and only the sender's transmitter, which reads the
direction's messages in order, knows that the numbers between were never used. Dropped are:
  duplicate     sequence below the expected one (already delivered), or another copy of one
                kept (the earliest fresh copy is kept);
  out_of_order  not next in line: it cannot be delivered before the missing one, which will
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

from kbroker.core.dialogs.envelope import H_FOLLOWS

STALE_AFTER_SECONDS = 10.0  # docs/sources.md#periodic-tasks


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
    follows: int | None = None  # the sender's declared predecessor (see the module's docstring)


def next_in_line(sequence: int, follows: int | None, expected: int) -> bool:
    """Whether a message numbered `sequence`, declared to follow `follows`, may be saved when its
    direction expects `expected` next: the expected one itself, or one past a gap its sender
    declared empty (its declared predecessor is already saved)."""
    return sequence == expected or (follows is not None and follows < expected < sequence)


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
            if not any(next_in_line(seq, b.follows, nxt) for b in copies):
                # past a gap, or past an expected message lost to staleness
                drop.extend((b, DropReason.OUT_OF_ORDER) for b in copies)
                continue
            # Next in line: keep the earliest fresh copy (a retransmission may be fresher).
            fresh = [b for b in copies if now - b.buffered_at < stale_after]
            drop.extend((b, DropReason.STALE) for b in copies if now - b.buffered_at >= stale_after)
            if not fresh:
                continue  # nxt stays: everything after it is now out of order
            keep.append(fresh[0])
            drop.extend((b, DropReason.DUPLICATE) for b in fresh[1:])
            nxt = seq + 1
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

    def offer(
        self, key: str, sequence: int, now: float, ref: Any, follows: int | None = None
    ) -> tuple[list[Any], DropReason | None]:
        """(refs to save now in order, why `ref` was dropped or None). `follows`: the sender's
        declared predecessor (None when it declared none: only the expected number is in line)."""
        nxt = self.expected.get(key, 0)
        if sequence < nxt:
            return [], DropReason.DUPLICATE
        if not next_in_line(sequence, follows, nxt):
            if len(self.buffered) >= self.max_buffered:
                return [], DropReason.OUT_OF_ORDER  # the sender sends it again
            self.buffered.append(Buffered(key, sequence, now, ref, follows))
            return [], None
        out = [ref]
        nxt = sequence + 1
        while True:
            mine = [b for b in self.buffered if b.conversation == key]
            ahead = sorted(
                (b for b in mine if b.sequence >= nxt and next_in_line(b.sequence, b.follows, nxt)),
                key=lambda b: b.sequence,
            )
            if not ahead:
                break
            taken = ahead[0]
            self.buffered = [b for b in self.buffered if not (b.conversation == key and b.sequence <= taken.sequence)]
            out.append(taken.ref)
            nxt = taken.sequence + 1
        self.expected[key] = nxt
        return out, None

    def waiting_for(self, key: str) -> int:
        """The number direction `key` expects next."""
        return self.expected.get(key, 0)

    def sweep(self, now: float, stale_after: float = STALE_AFTER_SECONDS) -> tuple[tuple[Buffered, DropReason], ...]:
        """The every-tick sweep over what is buffered (see `sweep`)."""
        result = sweep(self.buffered, self.expected, now, stale_after)
        self.buffered = list(result.keep)
        return result.drop

    def checkpoint(self) -> tuple[dict[str, int], list[Buffered]]:
        return dict(self.expected), list(self.buffered)

    def restore(self, saved: tuple[dict[str, int], list[Buffered]]) -> None:
        self.expected, self.buffered = dict(saved[0]), list(saved[1])


def declared_follows(headers: Iterable[tuple[str, bytes]]) -> int | None:
    """The predecessor a received message's sender declared (kb.follows), or None when it declared
    none or something unreadable (another client's record: then only the expected number is in line)."""
    for name, value in headers:
        if name == H_FOLLOWS:
            try:
                follows = int(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return None
            return follows if follows >= -1 else None
    return None


def gap_status(expected: int, sequence: int) -> str:
    """What the sender of a message that waits for an earlier one is told (its transmission_status)."""
    return (
        f"The far side expects message {expected} of this dialog next; message {sequence} waits for it "
        f"(sent again until the earlier one arrives)."
    )


def describe_drops(dropped: Iterable[tuple[Buffered, DropReason]], expected: Mapping[str, int]) -> dict[str, str]:
    """Per dialog direction, the sweep's drops in one line (the log names the conversation)."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for b, reason in dropped:
        by_key[b.conversation].append(f"{b.sequence} ({reason.value})")
    return {k: f"message(s) {', '.join(v)}, expecting {expected.get(k, 0)}" for k, v in by_key.items()}
