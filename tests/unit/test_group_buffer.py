"""GroupBuffer, RECEIVE's pure bookkeeping: which group a RECEIVE takes, in what order its records
come, group locks, rollback, revocation and the full-partition rule. No broker."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG, ERROR
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.receive.group_buffer import Buffered, GroupBuffer, receive_order

NOW_MS = 1_000_000
NO_FULL: dict[int, int] = {}
_offsets = itertools.count()


class FakeRecord:
    def value(self) -> bytes:
        return b""


class FakeLease:
    """A transaction's lease as the buffer sees it: who holds it and what it took."""

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.taken: list[Buffered] = []


def rec(
    group: str,
    *,
    priority: int = 5,
    at: int | None = None,
    partition: int = 0,
    offset: int | None = None,
    message_type: str = "T",
    conversation: str | None = None,
    expires: int | None = None,
    sequence: int | None = None,
) -> Buffered:
    """A buffered record; a DialogTimer or an Error is kbroker's own (sequence -1) unless given one."""
    off = next(_offsets) if offset is None else offset
    if sequence is None:
        sequence = -1 if message_type in (DIALOG_TIMER, ERROR) else 0
    env = Envelope(
        f"m{off}",
        conversation or group,
        group,
        sequence,
        message_type,
        "C",
        "F",
        "S",
        "TARGET",
        priority=priority,
        expires=expires,
    )
    return Buffered(env, FakeRecord(), partition, off, off if at is None else at)


def buffer_of(*records: Buffered) -> GroupBuffer[FakeLease]:
    buf: GroupBuffer[FakeLease] = GroupBuffer()
    for b in records:
        buf.accept(b)
    return buf


def take(
    buf: GroupBuffer[FakeLease],
    owner: object,
    top: int = 10,
    full: dict[int, int] = NO_FULL,
    lease: FakeLease | None = None,
    now_ms: int = NOW_MS,
    **filters: Any,
) -> tuple[FakeLease | None, list[Buffered]]:
    """What the receiver does for one RECEIVE: pick, then take into the group's lease."""
    group = buf.pick(owner, full, filters.get("group"), filters.get("conversation"))
    if group is None:
        return None, []
    lease = buf.holder(group) or lease or FakeLease(owner)
    taken = buf.take(lease, group, top, full, now_ms, filters.get("conversation"))
    lease.taken.extend(taken)
    return lease, taken


def test_priority_first_then_the_oldest_head():
    buf = buffer_of(
        rec("old-low", priority=3, at=1),
        rec("new-high", priority=9, at=50),
        rec("old-high", priority=9, at=20),
        rec("mid", priority=5, at=5),
    )
    order = []
    while (group := buf.pick(object(), NO_FULL)) is not None:
        order.append(group)
        buf.take(FakeLease(None), group, 10, NO_FULL, NOW_MS)
    assert order == ["old-high", "new-high", "mid", "old-low"]


def test_age_is_the_head_record_s_so_a_group_s_later_records_do_not_rank_it():
    buf = buffer_of(rec("a", at=10), rec("b", at=20), rec("a", at=30))
    _, first = take(buf, object(), top=1)
    assert [b.enqueued_ms for b in first] == [10]
    assert buf.pick(object(), NO_FULL) == "b"  # a's head is now 30: b is older


def test_dialog_timer_then_error_come_first_within_a_group_the_rest_in_arrival_order():
    records = [
        rec("g", message_type="A"),
        rec("g", message_type=ERROR),
        rec("g", message_type=END_DIALOG),
        rec("g", message_type=DIALOG_TIMER),
        rec("g", message_type="B"),
        rec("g", message_type=ERROR),
        rec("g", message_type=DIALOG_TIMER),
    ]
    buf = buffer_of(*records)
    _, taken = take(buf, object())
    kinds = [b.envelope.message_type_name for b in taken]
    assert kinds == [DIALOG_TIMER, DIALOG_TIMER, ERROR, ERROR, "A", END_DIALOG, "B"]
    timers = [b.offset for b in taken if b.envelope.message_type_name == DIALOG_TIMER]
    assert timers == sorted(timers)  # arrival order among equals


def test_the_far_sides_error_stays_behind_what_that_side_sent_before_it():
    """END CONVERSATION WITH ERROR's Error carries the next sequence number of its side: it is
    the last of that side's messages. Ahead of them it would end the dialog before they are
    received, and they would be set aside as sent after the end."""
    records = [
        rec("g", message_type="A", sequence=0),
        rec("g", message_type="B", sequence=1),
        rec("g", message_type=ERROR, sequence=2),
        rec("g", message_type=DIALOG_TIMER),
    ]
    _, taken = take(buffer_of(*records), object())
    assert [b.envelope.message_type_name for b in taken] == [DIALOG_TIMER, "A", "B", ERROR]


def test_a_locked_group_is_not_picked_by_another_owner_but_is_by_its_owner():
    me, other = object(), object()
    buf = buffer_of(rec("g", at=1), rec("g", at=2), rec("h", at=3))
    lease, first = take(buf, me, top=1)
    assert [b.enqueued_ms for b in first] == [1]
    assert buf.pick(other, NO_FULL) == "h"  # g is locked by me, though its head is older
    assert buf.pick(other, NO_FULL, group="g") is None
    assert buf.pick(me, NO_FULL) == "g"  # my own group gives more
    again, second = take(buf, me, top=1)
    assert again is lease and [b.enqueued_ms for b in second] == [2]
    assert buf.stats() == {
        "buffered": 1,
        "ready_groups": 1,
        "locked_groups": 1,
        "in_flight": 2,
        "oldest_lock_at": NOW_MS,
    }


def test_a_lock_s_age_is_from_its_first_take_until_its_release():
    me, other = object(), object()
    buf = buffer_of(rec("g", at=1), rec("g", at=2), rec("h", at=3))
    assert buf.stats()["oldest_lock_at"] is None
    lease, _ = take(buf, me, top=1, now_ms=1_000)
    take(buf, me, top=1, now_ms=5_000)  # the same lock taken again: its age runs on
    h_lease, _ = take(buf, other, top=1, now_ms=7_000)
    assert buf.stats()["oldest_lock_at"] == 1_000
    buf.release(lease, "g")
    assert buf.stats()["oldest_lock_at"] == 7_000
    buf.release(h_lease, "h")
    assert buf.stats()["oldest_lock_at"] is None


def test_the_owner_s_group_gives_way_to_an_older_ready_one():
    me = object()
    buf = buffer_of(rec("mine", at=1), rec("ready", at=5), rec("mine", at=9))
    take(buf, me, top=1)
    assert buf.pick(me, NO_FULL) == "ready"


def test_rollback_puts_records_back_at_the_head_in_order():
    me = object()
    buf = buffer_of(*(rec("g", at=i) for i in range(1, 6)))
    lease, taken = take(buf, me, top=3)
    assert [b.enqueued_ms for b in taken] == [1, 2, 3]
    buf.accept(rec("g", message_type=DIALOG_TIMER, at=6))  # arrives while g is locked
    buf.release(lease, "g", taken)
    assert buf.holder("g") is None and buf.buffered == 6
    _, again = take(buf, object())
    # The put-back records lead, in order; the timer that arrived meanwhile follows them.
    assert [b.enqueued_ms for b in again] == [1, 2, 3, 6, 4, 5]


def test_commit_unlocks_and_the_group_is_ready_again():
    me, other = object(), object()
    buf = buffer_of(rec("g", at=1), rec("g", at=2))
    lease, _ = take(buf, me, top=1)
    assert buf.pick(other, NO_FULL) is None
    buf.release(lease, "g")
    assert buf.pick(other, NO_FULL) == "g" and buf.buffered == 1


def test_a_release_by_a_lease_not_holding_the_lock_keeps_it():
    me = object()
    buf = buffer_of(rec("g", at=1), rec("g", at=2))
    lease, taken = take(buf, me, top=1)
    side = FakeLease(None)  # records split off the lease (re-keying), put back on failure
    buf.release(side, "g", taken)
    assert buf.holder("g") is lease
    assert buf.pick(object(), NO_FULL) is None


def test_revoke_drops_a_partition_s_records():
    buf = buffer_of(
        rec("a", partition=0, at=1),
        rec("b", partition=1, at=2),
        rec("a", partition=0, at=3),
        rec("c", partition=1, at=4),
    )
    buf.drop_partitions({0})
    assert buf.buffered == 2 and buf.records("a") == []
    seen = []
    while (group := buf.pick(object(), NO_FULL)) is not None:
        seen.append(group)
        buf.take(FakeLease(None), group, 10, NO_FULL, NOW_MS)
    assert seen == ["b", "c"]


def test_the_full_partition_hands_out_only_its_low_water_record():
    # Partition 0 is full with low water 7; partition 1 has room.
    buf = buffer_of(
        rec("urgent", priority=9, partition=0, offset=8, at=1),
        rec("low", partition=0, offset=7, at=2),
        rec("low", partition=0, offset=9, at=3),
        rec("other", priority=1, partition=1, offset=3, at=0),
    )
    full = {0: 7}
    owner = object()
    assert buf.pick(owner, full) == "low"  # "urgent" outranks it but lacks the low water
    _, taken = take(buf, owner, top=10, full=full)
    assert [b.offset for b in taken] == [7], "at most one record from a full partition"
    assert buf.pick(object(), full) == "other"  # nothing left on partition 0 holds offset 7
    assert buf.pick(object(), {}) == "urgent"  # room again: priority decides


def test_expired_records_are_taken_but_not_counted_against_top():
    buf = buffer_of(
        rec("g", at=1, expires=NOW_MS - 1), rec("g", at=2), rec("g", at=3, expires=NOW_MS + 1), rec("g", at=4)
    )
    _, taken = take(buf, object(), top=2)
    assert [b.enqueued_ms for b in taken] == [1, 2, 3]
    assert [b.live(NOW_MS) for b in taken] == [False, True, True]
    assert buf.buffered == 1


def test_top_zero_locks_the_group_without_taking():
    me = object()
    buf = buffer_of(rec("g", at=1))
    lease, taken = take(buf, me, top=0)
    assert taken == [] and buf.holder("g") is lease and buf.buffered == 1
    assert buf.pick(object(), NO_FULL) is None


def test_conversation_filter_takes_only_that_conversation_and_keeps_the_rest_in_order():
    buf = buffer_of(
        rec("g", conversation="x", at=1),
        rec("g", conversation="y", at=2),
        rec("g", conversation="x", at=3),
        rec("h", at=0),
    )
    _, taken = take(buf, object(), conversation="x")
    assert [b.enqueued_ms for b in taken] == [1, 3]
    assert [b.enqueued_ms for b in buf.records("g")] == [2]
    assert buf.pick(object(), NO_FULL, conversation="nowhere") is None


def _reference_pick(buf: GroupBuffer[FakeLease], groups: list[str], owner: object, full: dict[int, int]) -> str | None:
    """pick() by brute force: every group looked at, the owner's own winning ties."""
    best: tuple[tuple[int, int, int], int] | None = None
    name = None
    for g in groups:
        q = buf.records(g)
        holder = buf.holder(g)
        if not q or (holder is not None and holder.owner is not owner):
            continue
        low = full.get(q[0].partition)
        if low is not None and all(b.offset != low for b in q):
            continue
        key = (q[0].order, 0 if holder is not None else 1)
        if best is None or key < best:
            best, name = key, g
    return name


GROUPS = [f"g{i}" for i in range(6)]
OWNERS = [object(), object(), object()]

_accept = st.tuples(
    st.just("accept"), st.sampled_from(GROUPS), st.integers(1, 3), st.sampled_from(["T", "T", "T", DIALOG_TIMER, ERROR])
)
_receive = st.tuples(
    st.just("receive"),
    st.integers(0, 2),
    st.sampled_from([0, 1, 2, 5, 10]),
    st.dictionaries(st.integers(0, 2), st.integers(0, 20), max_size=2),
)
_release = st.tuples(st.just("release"), st.integers(0, 5), st.booleans())  # which lease
_toggle = st.tuples(st.just("toggle"), st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_accept, _accept, _accept, _receive, _release, _toggle), min_size=20, max_size=100))
def test_pick_matches_a_brute_force_look_and_no_record_is_lost(ops: list[tuple[Any, ...]]) -> None:
    """Any sequence of arrivals, RECEIVEs (some on full partitions), commits, rollbacks and
    revocations: pick() agrees with a look at every group, and every accepted record is
    buffered, held by a lease, committed or dropped with its partition, exactly once."""
    buf: GroupBuffer[FakeLease] = GroupBuffer()
    leases: dict[str, FakeLease] = {}
    live_partitions = {0, 1, 2}
    accepted: list[Buffered] = []
    gone: list[Buffered] = []  # committed, or dropped on a revocation
    for step, op in enumerate(ops):
        if op[0] == "accept":
            _, group, priority, kind = op
            partition = int(group[1:]) % 3
            if partition in live_partitions:
                b = rec(group, priority=priority, partition=partition, message_type=kind, at=step // 3)
                buf.accept(b)
                accepted.append(b)
        elif op[0] == "receive":
            _, who, top, lows = op
            owner = OWNERS[who]
            # A full partition's low water is one of its buffered records' offsets, or none.
            full = {}
            for p, i in lows.items():
                offsets = sorted(b.offset for g in GROUPS for b in buf.records(g) if b.partition == p)
                full[p] = offsets[i % len(offsets)] if offsets else i
            want = _reference_pick(buf, GROUPS, owner, full)
            got = buf.pick(owner, full)
            assert got == want
            if got is not None:
                lease = buf.holder(got) or FakeLease(owner)
                taken = buf.take(lease, got, top, full, NOW_MS)
                if taken and taken[0].partition in full:
                    assert len(taken) <= 1, "a full partition hands out one record at a time"
                lease.taken.extend(taken)
                leases[got] = lease
        elif op[0] == "release":
            _, which, commit = op
            if leases:
                group = sorted(leases)[which % len(leases)]
                lease = leases.pop(group)
                back = [] if commit else [b for b in lease.taken if b.partition in live_partitions]
                gone.extend(b for b in lease.taken if b not in back)
                buf.release(lease, group, back)
        else:
            p = op[1]
            live_partitions ^= {p}
            if p not in live_partitions:
                gone.extend(b for g in GROUPS for b in buf.records(g) if b.partition == p)
                buf.drop_partitions({p})
        buffered = [b for g in GROUPS for b in buf.records(g)]
        held = [b for lease in leases.values() for b in lease.taken]
        assert buf.buffered == len(buffered)
        assert sorted(map(id, buffered + held + gone)) == sorted(map(id, accepted))


def test_pick_matches_a_brute_force_look_over_random_operations():
    rng = random.Random(11)
    owners = [object(), object(), object()]
    groups = [f"g{i}" for i in range(12)]
    buf: GroupBuffer[FakeLease] = GroupBuffer()
    leases: dict[str, FakeLease] = {}
    live_partitions = {0, 1, 2}
    for step in range(4000):
        op = rng.random()
        if op < 0.45:
            group = rng.choice(groups)
            partition = int(group[1:]) % 3
            if partition in live_partitions:
                kind = rng.choice(["T"] * 8 + [DIALOG_TIMER, ERROR])
                buf.accept(rec(group, priority=rng.randint(1, 3), partition=partition, message_type=kind, at=step // 7))
        elif op < 0.8:
            owner = rng.choice(owners)
            full = {p: rng.randint(0, step) for p in live_partitions if rng.random() < 0.1}
            want = _reference_pick(buf, groups, owner, full)
            got = buf.pick(owner, full)
            assert got == want, f"step {step}"
            if got is not None:
                lease = buf.holder(got) or FakeLease(owner)
                lease.taken.extend(buf.take(lease, got, rng.randint(0, 3), full, NOW_MS))
                leases[got] = lease
        elif op < 0.97 and leases:
            group = rng.choice(sorted(leases))
            lease = leases.pop(group)
            back = lease.taken if rng.random() < 0.5 else []
            buf.release(lease, group, [b for b in back if b.partition in live_partitions])
        else:
            p = rng.choice([0, 1, 2])
            live_partitions ^= {p}
            if p not in live_partitions:
                buf.drop_partitions({p})
        assert buf.buffered == sum(len(buf.records(g)) for g in groups)


def msg(conversation: str, seq: int, *, priority: int = 5, to_side: str = "TARGET", kind: str = "T") -> Buffered:
    off = next(_offsets)
    env = Envelope(f"m{off}", conversation, "g", seq, kind, "C", "F", "S", to_side, priority=priority)
    return Buffered(env, FakeRecord(), 0, off, off)


def test_receive_order_returns_each_conversation_together_in_sequence():
    """Service Broker's RECEIVE order (reference item 97): a group's conversations one after the
    other, each in ascending sequence; the higher-priority conversation first, then the one whose
    message came first; each side of a dialog is a conversation of its own."""
    taken = [
        msg("a", 0),
        msg("b", 0),
        msg("a", 1),
        msg("c", 0, priority=9),
        msg("b", 1),
        msg("a", 0, to_side="INITIATOR"),
        msg("c", 1, priority=2),
        msg("a", 2),
        msg("a", -1, kind=DIALOG_TIMER),
    ]
    got = [
        (b.envelope.conversation_id, b.envelope.to_side[0], b.envelope.message_sequence_number)
        for b in receive_order(taken)
    ]
    assert got == [
        ("c", "T", 0),
        ("c", "T", 1),
        ("a", "T", -1),
        ("a", "T", 0),
        ("a", "T", 1),
        ("a", "T", 2),
        ("b", "T", 0),
        ("b", "T", 1),
        ("a", "I", 0),
    ]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 10)), max_size=30))
def test_receive_order_keeps_every_message_and_each_conversation_s_sequence(sends):
    counters: dict[str, int] = {}
    taken = []
    for conversation, priority in sends:
        counters[conversation] = counters.get(conversation, -1) + 1
        taken.append(msg(conversation, counters[conversation], priority=priority))
    got = receive_order(taken)
    assert sorted(id(b) for b in got) == sorted(id(b) for b in taken)
    runs = [b.envelope.conversation_id for b in got]
    assert all(runs.index(c) + runs.count(c) - 1 == len(runs) - 1 - runs[::-1].index(c) for c in set(runs)), runs
    for c in set(runs):
        seqs = [b.envelope.message_sequence_number for b in got if b.envelope.conversation_id == c]
        assert seqs == sorted(seqs)
