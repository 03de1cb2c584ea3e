"""The dispatcher's every-tick sweep: out-of-order, duplicate and stale buffered messages."""

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.routing.dispatch import STALE_AFTER_SECONDS, Buffered, DropReason, sweep

OOO, DUP, STALE = DropReason.OUT_OF_ORDER, DropReason.DUPLICATE, DropReason.STALE


def b(conv, seq, at, ref=None):
    return Buffered(conv, seq, at, ref)


def reasons(result):
    return {(m.conversation, m.sequence, m.buffered_at): r for m, r in result.drop}


def test_in_order_fresh_messages_stay():
    msgs = [b("c", 4, 99.0), b("c", 3, 98.0), b("c", 5, 99.5)]
    r = sweep(msgs, {"c": 3}, now=100.0)
    assert [m.sequence for m in r.keep] == [3, 4, 5] and r.drop == ()


def test_gap_makes_the_rest_out_of_order():
    r = sweep([b("c", 3, 99.0), b("c", 5, 99.0), b("c", 6, 99.0)], {"c": 3}, now=100.0)
    assert [m.sequence for m in r.keep] == [3]
    assert reasons(r) == {("c", 5, 99.0): OOO, ("c", 6, 99.0): OOO}


def test_below_expected_and_second_copies_are_duplicates():
    r = sweep([b("c", 1, 99.0), b("c", 2, 99.0), b("c", 2, 99.5)], {"c": 2}, now=100.0)
    assert r.keep == (b("c", 2, 99.0),)
    assert reasons(r) == {("c", 1, 99.0): DUP, ("c", 2, 99.5): DUP}


def test_stale_after_ten_seconds():
    assert STALE_AFTER_SECONDS == 10.0
    r = sweep([b("c", 0, 90.0)], {}, now=99.999)
    assert len(r.keep) == 1
    r = sweep([b("c", 0, 90.0), b("c", 1, 95.0)], {}, now=100.0)
    assert r.keep == () and reasons(r) == {("c", 0, 90.0): STALE, ("c", 1, 95.0): OOO}


def test_a_fresh_retransmission_replaces_a_stale_copy():
    r = sweep([b("c", 0, 80.0, "old"), b("c", 0, 99.0, "new")], {"c": 0}, now=100.0)
    assert [m.ref for m in r.keep] == ["new"]
    assert [(m.ref, why) for m, why in r.drop] == [("old", STALE)]


def test_conversations_are_independent_and_new_ones_expect_zero():
    msgs = [b("a", 0, 99.0), b("b", 1, 99.0), b("c", 7, 99.0)]
    r = sweep(msgs, {"c": 7}, now=100.0)
    assert {(m.conversation, m.sequence) for m in r.keep} == {("a", 0), ("c", 7)}
    assert reasons(r) == {("b", 1, 99.0): OOO}


def test_custom_stale_after():
    r = sweep([b("c", 0, 98.0)], {}, now=100.0, stale_after=2.0)
    assert reasons(r) == {("c", 0, 98.0): STALE}


buffers = st.lists(
    st.builds(
        Buffered,
        conversation=st.sampled_from(["a", "b"]),
        sequence=st.integers(0, 8),
        buffered_at=st.floats(80, 100, allow_nan=False),
        ref=st.integers(),
    ),
    max_size=40,
)


@given(buffers, st.integers(0, 4), st.integers(0, 4))
def test_every_message_is_kept_or_dropped_and_kept_ones_are_deliverable(msgs, ea, eb):
    expected = {"a": ea, "b": eb}
    r = sweep(msgs, expected, now=100.0)
    assert len(r.keep) + len(r.drop) == len(msgs)
    assert sorted(map(repr, [*r.keep, *(m for m, _ in r.drop)])) == sorted(map(repr, msgs))
    for conv in "ab":
        kept = [m for m in r.keep if m.conversation == conv]
        # Kept = a gap-free run from the expected number, one copy each, all fresh.
        assert [m.sequence for m in kept] == list(range(expected[conv], expected[conv] + len(kept)))
        assert all(100.0 - m.buffered_at < STALE_AFTER_SECONDS for m in kept)
        # Maximal: no fresh copy of the next expected message was dropped.
        nxt = expected[conv] + len(kept)
        assert not any(
            m.conversation == conv and m.sequence == nxt and 100.0 - m.buffered_at < STALE_AFTER_SECONDS
            for m, _ in r.drop
        )
