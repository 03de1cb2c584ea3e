"""The dispatcher's Inbox (core/routing/dispatch.py): per dialog direction, the next sequence number it
expects and the messages that arrived ahead of it. `offer` hands back what can be saved now, in
order; the every-tick `sweep` drops what is buffered (the sender retransmits it); `checkpoint` and
`restore` undo the offers of a batch whose transaction failed.

The guarantee, checked by the properties at the end for any interleaving of offers (duplicates,
reorderings, sweeps, failed batches): per direction, what was saved is exactly 0, 1, ..., k-1, in
that order, each once. Sweeps and a full buffer may delay delivery, never break it: once the
sender retransmits, everything arrives."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.routing.dispatch import (
    STALE_AFTER_SECONDS,
    Buffered,
    DropReason,
    Inbox,
    declared_follows,
    sweep,
)

DUP, OOO = DropReason.DUPLICATE, DropReason.OUT_OF_ORDER


def ref(key: str, seq: int, copy: int = 0) -> tuple[str, int, int]:
    """What the dispatcher passes as `ref`: here, enough to tell which copy came back."""
    return (key, seq, copy)


def offer(inbox: Inbox, key: str, seq: int, now: float = 0.0, copy: int = 0):
    return inbox.offer(key, seq, now, ref(key, seq, copy))


# --- offers ------------------------------------------------------------------------------------


def test_in_order_offers_are_returned_at_once():
    inbox = Inbox()
    for seq in range(4):
        assert offer(inbox, "k", seq) == ([ref("k", seq)], None)
    assert inbox.expected == {"k": 4} and inbox.buffered == []


def test_a_new_direction_expects_zero_and_one_that_was_acknowledged_expects_its_ack():
    inbox = Inbox()
    inbox.expected["k"] = 5  # loaded from the acks topic
    assert offer(inbox, "k", 5) == ([ref("k", 5)], None)
    assert offer(inbox, "new", 1) == ([], None)  # new expects 0: 1 waits
    assert offer(inbox, "new", 0) == ([ref("new", 0), ref("new", 1)], None)


def test_a_repeat_of_what_was_saved_is_a_duplicate():
    inbox = Inbox()
    offer(inbox, "k", 0)
    offer(inbox, "k", 1)
    assert offer(inbox, "k", 0, copy=1) == ([], DUP)
    assert offer(inbox, "k", 1, copy=1) == ([], DUP)
    assert inbox.expected == {"k": 2} and inbox.buffered == []


def test_a_message_ahead_of_a_gap_waits_and_is_released_in_order_when_the_gap_fills():
    inbox = Inbox()
    assert offer(inbox, "k", 3, now=1.0) == ([], None)
    assert offer(inbox, "k", 1, now=2.0) == ([], None)
    assert [(b.sequence, b.buffered_at) for b in inbox.buffered] == [(3, 1.0), (1, 2.0)]
    assert offer(inbox, "k", 0) == ([ref("k", 0), ref("k", 1)], None)  # 2 is still missing
    assert [b.sequence for b in inbox.buffered] == [3]
    assert offer(inbox, "k", 2) == ([ref("k", 2), ref("k", 3)], None)
    assert inbox.expected == {"k": 4} and inbox.buffered == []


def test_two_copies_ahead_of_a_gap_are_released_once_the_first_to_arrive():
    inbox = Inbox()
    offer(inbox, "k", 1, copy=0)
    offer(inbox, "k", 1, copy=1)  # a retransmission while the first copy waits
    assert offer(inbox, "k", 0) == ([ref("k", 0), ref("k", 1, 0)], None)
    assert inbox.buffered == []
    assert offer(inbox, "k", 1, copy=2) == ([], DUP)


def test_directions_are_independent():
    inbox = Inbox()
    offer(inbox, "a", 1)
    offer(inbox, "b", 1)
    assert offer(inbox, "a", 0) == ([ref("a", 0), ref("a", 1)], None)
    assert [(b.conversation, b.sequence) for b in inbox.buffered] == [("b", 1)]
    assert offer(inbox, "b", 0) == ([ref("b", 0), ref("b", 1)], None)


def test_a_full_buffer_refuses_what_is_ahead_but_still_takes_the_expected_one():
    inbox = Inbox(max_buffered=2)
    assert offer(inbox, "k", 1) == ([], None)
    assert offer(inbox, "j", 5) == ([], None)
    assert offer(inbox, "k", 2) == ([], OOO)  # the sender sends it again
    assert len(inbox.buffered) == 2
    assert offer(inbox, "k", 0) == ([ref("k", 0), ref("k", 1)], None)
    assert offer(inbox, "k", 2) == ([ref("k", 2)], None)


# --- checkpoint and restore ----------------------------------------------------------------------


def test_restore_undoes_the_offers_of_a_failed_batch():
    inbox = Inbox()
    offer(inbox, "k", 0)
    offer(inbox, "k", 2)
    saved = inbox.checkpoint()
    offer(inbox, "k", 1)  # would release 1 and 2 ...
    offer(inbox, "k", 4)
    offer(inbox, "j", 0)
    inbox.restore(saved)  # ... but the batch's transaction failed
    assert inbox.expected == {"k": 1}
    assert [(b.conversation, b.sequence) for b in inbox.buffered] == [("k", 2)]
    # The batch is read again: the same offers give the same answers.
    assert offer(inbox, "k", 1) == ([ref("k", 1), ref("k", 2)], None)
    assert offer(inbox, "j", 0) == ([ref("j", 0)], None)


def test_a_checkpoint_is_a_snapshot_and_can_be_restored_twice():
    inbox = Inbox()
    offer(inbox, "k", 3)
    saved = inbox.checkpoint()
    for _ in range(2):
        offer(inbox, "k", 0)
        offer(inbox, "k", 1)
        inbox.sweep(100.0)
        inbox.restore(saved)
        assert inbox.expected == {} and [b.sequence for b in inbox.buffered] == [3]
    assert saved == ({}, [Buffered("k", 3, 0.0, ref("k", 3))])


# --- the sweep ---------------------------------------------------------------------------------


def test_sweep_drops_everything_buffered_as_out_of_order():
    # The Inbox buffers only what is ahead of a gap (the expected message is returned, never
    # buffered), so the seed's sweep finds each buffered message past a gap, fresh or stale.
    inbox = Inbox()
    offer(inbox, "k", 2, now=0.0)
    offer(inbox, "k", 3, now=95.0)
    offer(inbox, "j", 1, now=99.0)
    before, expected = list(inbox.buffered), dict(inbox.expected)
    dropped = inbox.sweep(100.0)
    assert dropped == sweep(before, expected, 100.0).drop  # the seed's sweep, over the Inbox's state
    assert sorted((b.conversation, b.sequence, why) for b, why in dropped) == [
        ("j", 1, OOO),
        ("k", 2, OOO),
        ("k", 3, OOO),
    ]
    assert [b.ref for b, _ in dropped if b.sequence == 3] == [ref("k", 3)]
    assert inbox.buffered == [] and inbox.expected == {}


def test_after_a_sweep_the_gap_releases_only_itself_and_retransmissions_bring_the_rest():
    inbox = Inbox()
    offer(inbox, "k", 1)
    inbox.sweep(STALE_AFTER_SECONDS)
    assert offer(inbox, "k", 0) == ([ref("k", 0)], None)
    assert offer(inbox, "k", 1, copy=1) == ([ref("k", 1, 1)], None)


def test_sweep_keeps_a_fresh_expected_message_of_a_restored_state_and_drops_a_stale_one():
    # Only reachable through a saved state that holds the expected message (the Inbox itself
    # never buffers it); the sweep's staleness rule then applies as in sweep().
    inbox = Inbox()
    inbox.restore(({"a": 0, "b": 0}, [Buffered("a", 0, 95.0, "fresh"), Buffered("b", 0, 80.0, "old")]))
    dropped = inbox.sweep(100.0)
    assert [(b.ref, why) for b, why in dropped] == [("old", DropReason.STALE)]
    assert [b.ref for b in inbox.buffered] == ["fresh"]


# --- properties --------------------------------------------------------------------------------

KEYS = ("a", "b", "c")


def check_output(key, returned, expected_before, log):
    """Returned refs continue the direction's log gap-free: expected, expected + 1, ..."""
    seqs = [r[1] for r in returned]
    assert all(r[0] == key for r in returned)
    assert seqs == list(range(expected_before, expected_before + len(seqs)))
    log[key].extend(seqs)


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(KEYS), st.integers(1, 8), min_size=1), st.data())
def test_any_order_of_offers_saves_each_message_once_in_order(sizes, data):
    """Without sweeps: every sequence offered at least once, in any order and with copies, ends
    as exactly 0..n-1 per direction, each saved at the moment its predecessors all arrived."""
    offers = [(k, s) for k, n in sizes.items() for s in range(n)]
    offers += data.draw(st.lists(st.sampled_from(offers), max_size=15))  # copies
    offers = data.draw(st.permutations(offers))
    inbox = Inbox()
    log: dict[str, list[int]] = defaultdict(list)
    seen: dict[str, set[int]] = defaultdict(set)
    for i, (key, seq) in enumerate(offers):
        nxt = inbox.expected.get(key, 0)
        returned, why = inbox.offer(key, seq, float(i), (key, seq, i))
        seen[key].add(seq)
        check_output(key, returned, nxt, log)
        assert (why is DUP) == (seq < nxt) and why in (None, DUP)
        # Saved is exactly the longest run 0, 1, ... of what has been offered.
        run = 0
        while run in seen[key]:
            run += 1
        assert inbox.expected.get(key, 0) == run == len(log[key])
    assert dict(log) == {k: list(range(n)) for k, n in sizes.items()}
    assert inbox.buffered == []


ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.sampled_from(KEYS), st.integers(0, 7)),
        st.tuples(st.just("sweep"), st.floats(0.0, 12.0)),
        st.tuples(st.just("batch"), st.booleans()),  # end the current batch: committed or failed
    ),
    max_size=60,
)


@settings(max_examples=400)
@given(ops, st.integers(1, 6))
def test_saved_is_always_a_gap_free_prefix_and_retransmission_completes_it(history, max_buffered):
    """Offers, sweeps and batches that commit or fail (restore) in any interleaving: what was
    saved (by committed batches, plus the open one) is 0..k-1 per direction, once each, where k is
    what the Inbox expects next; every buffered message is ahead of it. Then the sender's
    retransmission of everything in order saves the rest, and only the rest."""
    inbox = Inbox(max_buffered=max_buffered)
    committed: dict[str, list[int]] = defaultdict(list)
    pending: dict[str, list[int]] = defaultdict(list)
    saved_state = inbox.checkpoint()
    now = 0.0
    for op in history:
        if op[0] == "offer":
            _, key, seq = op
            nxt = inbox.expected.get(key, 0)
            returned, why = inbox.offer(key, seq, now, (key, seq, now))
            log = {k: committed[k] + pending[k] for k in KEYS}
            check_output(key, returned, nxt, log)
            pending[key].extend(r[1] for r in returned)
            if seq < nxt:
                assert (returned, why) == ([], DUP)
            elif seq > nxt:
                assert returned == [] and why in (None, OOO)
            else:
                assert returned[0] == (key, seq, now) and why is None
        elif op[0] == "sweep":
            now += op[1]
            assert all(why is OOO for _, why in inbox.sweep(now))
            assert inbox.buffered == []
        else:
            if op[1]:
                for k in KEYS:
                    committed[k].extend(pending[k])
            else:
                inbox.restore(saved_state)
            pending = defaultdict(list)
            saved_state = inbox.checkpoint()
        for k in KEYS:
            log = committed[k] + pending[k]
            assert log == list(range(len(log))) and inbox.expected.get(k, 0) == len(log)
        assert all(b.sequence > inbox.expected.get(b.conversation, 0) for b in inbox.buffered)
        assert len(inbox.buffered) <= max_buffered
    # Retransmission: the sender sends everything it still has, in sequence order.
    for k in KEYS:
        for seq in range(8):
            nxt = inbox.expected.get(k, 0)
            returned, why = inbox.offer(k, seq, now, (k, seq, "again"))
            log = {key: committed[key] + pending[key] for key in KEYS}
            check_output(k, returned, nxt, log)
            pending[k].extend(r[1] for r in returned)
        assert committed[k] + pending[k] == list(range(8))


# --- declared jumps (a send lease claimed after its holder died starts past a gap) ---------------


def test_a_jump_declared_after_acknowledged_messages_is_saved_at_once():
    """The dead holder's 0..2 were saved; the next holder's first message is 1024 and its
    transmitter held nothing before it (-1): nothing unsaved comes between."""
    inbox = Inbox()
    inbox.expected["k"] = 3
    assert inbox.offer("k", 1024, 0.0, "m1024", follows=-1) == (["m1024"], None)
    assert inbox.offer("k", 1025, 0.0, "m1025", follows=1024) == (["m1025"], None)
    assert inbox.expected == {"k": 1026}


def test_a_jump_that_follows_an_unsaved_message_waits_for_it():
    inbox = Inbox()
    inbox.expected["k"] = 3
    assert inbox.offer("k", 1024, 0.0, "m1024", follows=3) == ([], None)
    assert inbox.offer("k", 3, 0.0, "m3", follows=2) == (["m3", "m1024"], None)
    assert inbox.expected == {"k": 1025} and inbox.buffered == []


def test_an_undeclared_or_unreadable_jump_waits_and_the_sweep_drops_it():
    inbox = Inbox()
    inbox.expected["k"] = 3
    assert inbox.offer("k", 1024, 0.0, "m1024") == ([], None)
    assert inbox.offer("k", 1025, 0.0, "m1025", follows=1025) == ([], None)  # follows itself: no declaration
    assert sorted(r.value for _, r in inbox.sweep(1.0)) == ["out_of_order", "out_of_order"]
    assert inbox.expected == {"k": 3}


def test_the_sweep_keeps_what_a_declared_jump_puts_in_line():
    kept = sweep(
        [
            Buffered("k", 1024, 0.0, "a", follows=-1),
            Buffered("k", 1025, 0.0, "b", follows=1024),
            Buffered("k", 2000, 0.0, "c", follows=1500),
        ],
        {"k": 3},
        now=1.0,
    )
    assert [b.ref for b in kept.keep] == ["a", "b"]
    assert [(b.ref, r) for b, r in kept.drop] == [("c", OOO)]


def test_declared_follows_reads_the_header_and_ignores_what_is_not_a_number():
    assert declared_follows([("kb.follows", b"-1")]) == -1
    assert declared_follows([("x", b"1"), ("kb.follows", b"17")]) == 17
    assert declared_follows([]) is None
    assert declared_follows([("kb.follows", b"-2")]) is None
    assert declared_follows([("kb.follows", b"\xff")]) is None
    assert declared_follows([("kb.follows", b"one")]) is None


@settings(max_examples=400)
@given(st.lists(st.integers(1, 1024), min_size=1, max_size=8), st.data())
def test_a_chain_with_gaps_is_saved_once_in_order_whatever_the_offers(gaps, data):
    """A direction's messages numbered 0 < s1 < s2 ... with gaps (one lease claim after another's
    holder died), offered in any order with copies, each copy declaring what a transmitter would:
    its predecessor, or -1 when that predecessor was saved already (it was acknowledged). What is
    saved is always a prefix of the chain, in order, once each; sending everything again in order
    completes it."""
    chain = [0]
    for g in gaps:
        chain.append(chain[-1] + g)
    picks = data.draw(st.lists(st.integers(0, len(chain) - 1), max_size=25))
    inbox = Inbox()
    saved: list[int] = []

    def offer_index(i: int) -> None:
        nxt = inbox.expected.get("k", 0)
        acked = i > 0 and chain[i - 1] < nxt
        follows = -1 if i == 0 or (acked and data.draw(st.booleans())) else chain[i - 1]
        returned, _ = inbox.offer("k", chain[i], 0.0, chain[i], follows=follows)
        saved.extend(returned)
        assert saved == chain[: len(saved)]
        assert inbox.expected.get("k", 0) == (saved[-1] + 1 if saved else 0)

    for i in picks:
        offer_index(i)
    for i in range(len(chain)):  # the sender's retransmission, in order
        offer_index(i)
    assert saved == chain
