"""The start-up purge's pure rules (core/receive/expired_heads.py): which records of a partition's
head may go, where the run ends and when a partition is done; with the buffer's and the offset
tracker's parts it uses (GroupBuffer.unlocked_heads / take_head, PartitionOffsets.lowest_incomplete),
driven over rounds as the receiver drives them. No broker."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.receive.expired_heads import Head, expired_head, head_settled
from kbroker.core.receive.group_buffer import Buffered, GroupBuffer
from kbroker.core.receive.offsets import PartitionOffsets

NOW_MS = 1_000_000
EXPIRED, LIVE, BUSY = "expired", "live", "busy"


class Rec:
    """A record as the run reads it: expired or live at NOW_MS."""

    def __init__(self, offset: int, expired: bool) -> None:
        self.offset, self.expired = offset, expired

    def live(self, now_ms: int) -> bool:
        assert now_ms == NOW_MS
        return not self.expired


class FakeRecord:
    def value(self) -> bytes:
        return b""


class Holder:
    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.taken: list[Buffered] = []


def buffered(group: str, offset: int, expired: bool) -> Buffered:
    env = Envelope(f"m{offset}", group, group, 0, "T", "C", "F", "S", "TARGET", expires=NOW_MS - 1 if expired else None)
    return Buffered(env, FakeRecord(), 0, offset, offset)


kinds = st.lists(st.sampled_from([EXPIRED, LIVE, BUSY]), max_size=30)


@given(kinds, st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=40))
def test_the_run_is_the_expired_prefix_and_ends_where_it_must(kinds: list[str], gap: int, limit: int) -> None:
    offsets = [i * gap for i in range(len(kinds))]  # gaps: markers and aborted records
    available = {o: Rec(o, k == EXPIRED) for o, k in zip(offsets, kinds, strict=True) if k != BUSY}
    taken, head = expired_head(offsets, available, NOW_MS, limit)
    n = len(taken)
    assert [r.offset for r in taken] == offsets[:n]  # a prefix, in order, no gap skipped
    assert all(k == EXPIRED for k in kinds[:n])  # never a live one, never one not available
    assert n <= limit
    if n == len(kinds) or n == limit:
        assert head is Head.OPEN
    else:  # stopped early, at the first record that is not an expired one to take
        assert n < limit
        assert head is {LIVE: Head.LIVE, BUSY: Head.BUSY}[kinds[n]]
    run = next((i for i, k in enumerate(kinds) if k != EXPIRED), len(kinds))
    assert n == min(run, limit)  # all of the expired head that fits


def test_a_partition_is_done_at_a_live_head_or_read_to_its_end_with_nothing_left() -> None:
    assert head_settled(Head.LIVE, 0, False) and head_settled(Head.LIVE, 3, True)
    assert head_settled(Head.OPEN, 0, True)
    assert not head_settled(Head.OPEN, 2, True)  # those taken must commit first: look once more
    assert not head_settled(Head.OPEN, 0, False)  # more may be fetched
    assert not head_settled(Head.BUSY, 0, True)  # someone holds the next record: look again


def test_lowest_incomplete_lists_what_is_fetched_and_not_completed_ascending() -> None:
    t = PartitionOffsets(10)
    for off in (14, 10, 12, 17, 11):
        t.fetched(off)
    t.complete(11)
    assert t.lowest_incomplete(3) == [10, 12, 14]
    assert t.lowest_incomplete(10) == [10, 12, 14, 17]
    t.reopen(11)
    assert t.lowest_incomplete(2) == [10, 11]


def test_take_head_takes_the_head_alone_and_locks_the_rest_of_its_group() -> None:
    buf: GroupBuffer[Holder] = GroupBuffer()
    first, second = buffered("g", 0, True), buffered("g", 1, False)
    other = buffered("h", 2, True)
    for b in (first, second, other):
        buf.accept(b)
    assert buf.unlocked_heads() == {"g": first, "h": other}
    purge = Holder(object())
    assert buf.take_head(purge, "g", NOW_MS) is first
    assert buf.buffered == 2 and buf.holder("g") is purge
    assert buf.unlocked_heads() == {"h": other}  # g is locked: its live record is not offered
    assert buf.pick(object(), {}) == "h"
    buf.release(purge, "g")  # committed: nothing back
    assert buf.unlocked_heads() == {"g": second, "h": other}


@given(
    st.lists(st.booleans(), max_size=60),
    st.integers(min_value=1, max_value=7),
    st.integers(min_value=1, max_value=9),
    st.randoms(use_true_random=False),
)
def test_rounds_over_a_fetched_partition_remove_exactly_its_expired_head(
    expired: list[bool], fetch: int, limit: int, rnd: random.Random
) -> None:
    """A partition fetched `fetch` records at a time, a round of take, commit, release after each
    fetch (some rounds' commits fail and put the records back), as the receiver and the purge
    do (a round that settles the partition ends the pass only once its commit is in): once
    settled, exactly the leading expired records are gone and nothing live was taken."""
    tracker = PartitionOffsets(0)
    buf: GroupBuffer[Holder] = GroupBuffer()
    fetched = removed = 0
    for _round in range(10 * len(expired) + 10):
        at_end = fetched == len(expired)
        heads = {b.offset: b for b in buf.unlocked_heads().values()}
        taken, head = expired_head(tracker.lowest_incomplete(limit + 1), heads, NOW_MS, limit)
        holders = []
        for b in taken:
            holder = Holder(object())
            assert buf.take_head(holder, b.envelope.conversation_group_id, NOW_MS) is b
            holders.append((holder, b))
        commits = rnd.random() < 0.8
        for holder, b in holders:
            if commits:
                tracker.complete(b.offset)
                tracker.settled(b.offset)
            buf.release(holder, b.envelope.conversation_group_id, [] if commits else [b])
        removed += len(holders) if commits else 0
        if commits and head_settled(head, len(taken), at_end):  # a failed commit put its records back
            break
        for off in range(fetched, min(fetched + fetch, len(expired))):
            tracker.fetched(off)
            buf.accept(buffered(f"g{off}", off, expired[off]))
        fetched = min(fetched + fetch, len(expired))
    else:
        raise AssertionError("never settled")
    run = next((i for i, e in enumerate(expired) if not e), len(expired))
    assert removed == run
    assert tracker.low_water() == run  # the committed offset: the first live record, or the end
