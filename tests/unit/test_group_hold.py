"""The fold of the holds topic (core/dialogs/group_hold.py): which records every reader accepts,
so that a group is held by one process at a time across processes."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.group_hold import (
    HOLD_SECONDS,
    PRUNE_AFTER,
    HoldBook,
    HoldRecord,
    MalformedHoldRecord,
)

Q, G, P = "Orders", "g1", 0
KEY = (Q, None, G)


def rec(kind: str, by: str, at: float = 100.0, **kw) -> HoldRecord:
    group = None if kind in ("own", "disown") else G
    kw.setdefault("until", at + HOLD_SECONDS)
    return HoldRecord(kind, Q, None, P, by, at, group=group, **kw)


def folded(*records: HoldRecord) -> tuple[HoldBook, list[bool]]:
    book = HoldBook()
    return book, [book.fold(r) for r in records]


def test_a_claim_is_held_once_the_partitions_owner_grants_it():
    book, accepted = folded(rec("own", "R", epoch=1), rec("claim", "S", epoch=1))
    h = book.hold(KEY)
    assert accepted == [True, True] and h is not None and not h.usable_by("S", 101)
    assert not book.fold(rec("grant", "X", epoch=1, to="S"))  # not the owner: refused
    assert book.fold(rec("grant", "R", epoch=1, to="S"))
    h = book.hold(KEY)
    assert h is not None and h.usable_by("S", 101) and not h.usable_by("R", 101)


def test_of_two_claims_from_one_state_the_first_in_the_log_wins():
    book, accepted = folded(rec("own", "R", epoch=1), rec("claim", "S1", epoch=1), rec("claim", "S2", epoch=1))
    assert accepted == [True, True, False]
    assert book.fold(rec("grant", "R", epoch=1, to="S2")) is False  # not the accepted claimant
    h = book.hold(KEY)
    assert h is not None and h.holder == "S1"


def test_a_take_stands_only_over_the_owner_record_its_writer_saw():
    book, accepted = folded(rec("take", "S", epoch=1, over=-1))
    assert accepted == [True] and book.hold(KEY).usable_by("S", 101)  # type: ignore[union-attr]
    # A new owner came between the writer's read and its take: the take is refused.
    book, accepted = folded(rec("own", "R", epoch=1), rec("take", "S", epoch=1, over=-1))
    assert accepted == [True, False] and book.hold(KEY) is None
    # Over the owner record it saw (one that ran out): accepted.
    book, accepted = folded(rec("own", "R", epoch=3), rec("take", "S", epoch=1, over=3))
    assert accepted == [True, True]
    # A claim waiting for its grant may become the claimant's own take.
    book, accepted = folded(rec("claim", "S", epoch=1), rec("take", "S", epoch=1, over=-1))
    assert accepted == [True, True] and book.hold(KEY).granted  # type: ignore[union-attr]
    book, accepted = folded(rec("claim", "S", epoch=1), rec("take", "T", epoch=1, over=-1))
    assert accepted == [True, False]


def test_only_the_holder_renews_or_releases_and_a_release_frees_the_group():
    book, accepted = folded(
        rec("take", "S", epoch=1, over=-1),
        rec("renew", "T", epoch=1, until=500.0),
        rec("release", "T", epoch=1),
        rec("renew", "S", epoch=1, until=300.0),
    )
    assert accepted == [True, False, False, True]
    assert book.hold(KEY).until == 300.0  # type: ignore[union-attr]
    assert book.fold(rec("release", "S", epoch=1)) and book.hold(KEY) is None
    assert book.fold(rec("claim", "T", epoch=2))


def test_a_claim_of_the_next_epoch_takes_over_and_the_old_holder_can_no_longer_renew():
    """Its writer claims only once the hold ran out by its clock (the holder stopped renewing:
    it died, or lost the broker); the fold takes the log's word."""
    book, accepted = folded(
        rec("take", "S", epoch=1, over=-1),
        rec("claim", "T", epoch=2, at=120.0),
        rec("renew", "S", epoch=1, at=120.5),
        rec("release", "S", epoch=1, at=120.6),
    )
    assert accepted == [True, True, False, False]
    h = book.hold(KEY)
    assert h is not None and h.holder == "T" and not h.usable_by("S", 120.7)


def test_an_owner_taken_over_can_no_longer_renew_or_give_up_the_partition():
    book, accepted = folded(
        rec("own", "R1", epoch=1),
        rec("own", "R2", epoch=2),  # the consumer group moved the partition
        rec("own", "R1", epoch=1, at=102),  # R1's late renewal
        rec("disown", "R1", epoch=1),
    )
    assert accepted == [True, True, False, False]
    assert book.owner((Q, None, P)).owner == "R2"  # type: ignore[union-attr]
    assert book.fold(rec("disown", "R2", epoch=2)) and book.owner((Q, None, P)) is None


def test_entries_that_ran_out_long_ago_are_forgotten_by_the_records_time():
    book, _ = folded(rec("own", "R", epoch=1, at=100.0), rec("take", "S", epoch=1, over=1, at=100.0))
    book.fold(rec("want", "X", at=100.0 + HOLD_SECONDS + PRUNE_AFTER - 1, epoch=1))
    assert book.hold(KEY) is not None
    book.fold(rec("want", "X", at=100.0 + HOLD_SECONDS + PRUNE_AFTER + 1, epoch=1))
    assert book.hold(KEY) is None and book.owner((Q, None, P)) is None


def test_records_round_trip_and_anything_else_is_refused_by_type():
    r = rec("grant", "R", epoch=4, to="S")
    assert HoldRecord.from_json(r.to_json()) == r
    for raw in (b"", b"[]", b'{"kind": "grant"}', orjson.dumps({**orjson.loads(r.to_json()), "kind": "steal"})):
        with pytest.raises(MalformedHoldRecord):
            HoldRecord.from_json(raw)
    own_with_group = orjson.dumps({**orjson.loads(rec("own", "R").to_json()), "group": "g"})
    with pytest.raises(MalformedHoldRecord):
        HoldRecord.from_json(own_with_group)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_fields = st.sampled_from(
    ["kind", "queue", "instance", "partition", "by", "at", "group", "epoch", "until", "to", "over"]
)


@given(st.dictionaries(_fields, _values, max_size=11))
def test_any_json_object_is_a_hold_record_or_malformed(d):
    try:
        r = HoldRecord.from_json(orjson.dumps(d))
    except MalformedHoldRecord:
        return
    HoldBook().fold(r)  # what decodes, folds


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["own", "disown", "claim", "grant", "take", "renew", "release", "want"]),
            st.sampled_from(["R1", "R2", "S1", "S2"]),
            st.integers(-1, 3),
            st.sampled_from([None, "S1", "S2"]),
        ),
        max_size=40,
    )
)
def test_any_log_gives_each_group_one_holder_granted_by_its_owner_or_its_own_take(log):
    """Whatever the writers do, a group's hold is granted only by a `grant` of the partition's
    owner at that point of the log or by a `take` over the owner record then current."""
    book = HoldBook()
    for i, (kind, by, epoch, to) in enumerate(log):
        before_owner = book.owner((Q, None, P))
        before = book.hold(KEY)
        r = rec(kind, by, at=100.0 + i * 0.01, epoch=epoch, to=to, over=epoch)
        accepted = book.fold(r)
        after = book.hold(KEY)
        if after is not None and after.granted and (before is None or not before.granted or before != after):
            if kind == "grant" and before is not None:
                assert accepted and before_owner is not None and before_owner.owner == by
            elif kind == "take":
                assert accepted and (before_owner.epoch if before_owner else -1) == epoch
            else:  # a renewal or grant nobody had seen the claim of (a reader that started later)
                assert kind in ("renew", "grant") and (before is None or kind == "renew")
