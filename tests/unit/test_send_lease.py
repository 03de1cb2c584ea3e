"""The lease fold (core/dialogs/send_lease.py): every reader folds the same records in the same order,
so what it must give is one holder per epoch, a holder that cannot be undone by a stale writer,
and sequence ceilings that never go back while a lease passes from process to process."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.send_lease import (
    LEASE_SECONDS,
    MARGIN,
    RENEW_WITHIN,
    SEQUENCE_SPAN,
    SendLease,
    first_claim,
    folded,
)

H = "h"


def fold(records: list[SendLease]) -> tuple[SendLease | None, list[SendLease]]:
    cur: SendLease | None = None
    accepted = []
    for r in records:
        new = folded(cur, r)
        if new is not None:
            cur = new
            accepted.append(new)
    return cur, accepted


def test_of_two_claims_from_one_state_the_first_in_the_log_wins():
    base = first_claim(H, "a", 0.0, ()).released(1.0, 5, "CO")
    b = base.claimed("b", 2.0, ("tb",), 5)
    c = base.claimed("c", 2.0, ("tc",), 5)
    cur, _ = fold([base, b, c])
    assert cur == b
    cur, _ = fold([base, c, b])
    assert cur == c


def test_a_holder_taken_over_can_neither_renew_nor_release():
    a = first_claim(H, "a", 0.0, ("ta",))
    b = a.claimed("b", LEASE_SECONDS + 1, ("tb",), a.ceiling)  # a's lease ran out
    cur, _ = fold([a, b, a.renewed(LEASE_SECONDS + 2, 3, ("ta",)), a.released(LEASE_SECONDS + 3, 3, "CO")])
    assert cur == b


def test_a_claim_starts_past_the_ceiling_and_a_release_says_the_exact_next():
    a = first_claim(H, "a", 0.0, ())
    assert a.ceiling == SEQUENCE_SPAN
    r = a.released(1.0, 7, "CO")
    assert r.owner is None and r.ceiling == 7
    b = r.claimed("b", 2.0, (), r.ceiling)
    assert b.ceiling == 7 + SEQUENCE_SPAN and b.epoch == 2


def test_held_and_free_follow_the_clock_with_the_margin():
    a = first_claim(H, "a", 100.0, ())
    assert a.held_by("a", 100.0 + LEASE_SECONDS - MARGIN - 0.1)
    assert not a.held_by("a", 100.0 + LEASE_SECONDS - MARGIN + 0.1)  # stops using it early
    assert not a.free_for("b", 100.0 + LEASE_SECONDS - 0.1)
    assert a.free_for("b", 100.0 + LEASE_SECONDS)
    assert a.free_for("a", 100.0)


def test_a_renewal_raises_the_ceiling_when_the_sequences_near_it():
    a = first_claim(H, "a", 0.0, ())
    assert not a.needs_renewal(1.0, 10)
    assert a.needs_renewal(1.0, a.ceiling)
    assert a.needs_renewal(LEASE_SECONDS - 1.0, 10)
    assert a.renewed(1.0, a.ceiling, ()).ceiling == a.ceiling + SEQUENCE_SPAN


def test_records_round_trip():
    a = first_claim(H, "a", 1.5, ("t1", "t2"), 3).released(2.0, 9, "DO")
    assert SendLease.from_json(a.to_json()) == a


PROCESSES = ["a", "b", "c"]


@st.composite
def histories(draw):
    """Lease records as processes would write them, each from its own (possibly stale) view of
    the accepted lease: claims, renewals and releases interleaved in any order."""
    records = [first_claim(H, draw(st.sampled_from(PROCESSES)), 0.0, ())]
    seen = [records[0]]  # leases a process might have read (any accepted or written one)
    for step in range(draw(st.integers(0, 25))):
        view = draw(st.sampled_from(seen))
        who = draw(st.sampled_from(PROCESSES))
        kind = draw(st.sampled_from(["claim", "renew", "release"]))
        now = float(step + 1)
        if kind == "claim":
            r = view.claimed(who, now, (), view.ceiling + draw(st.integers(0, 3)))
        elif kind == "renew":
            r = SendLease(H, view.epoch, who, who, now + LEASE_SECONDS, view.ceiling + draw(st.integers(0, 3)))
        else:
            r = SendLease(H, view.epoch, None, who, now, view.ceiling + draw(st.integers(0, 3)))
        records.append(r)
        seen.append(r)
    return records


@given(histories())
def test_one_holder_per_epoch_and_only_the_holder_extends_it(records):
    _, accepted = fold(records)
    owners: dict[int, str] = {}
    for prev, cur in zip(accepted, accepted[1:]):
        assert cur.epoch in (prev.epoch, prev.epoch + 1)
        if cur.epoch == prev.epoch:  # a renewal or a release: only by the holder
            assert prev.owner is not None and cur.by == prev.owner
        else:  # a claim: by the one it names
            assert cur.owner == cur.by
    for lease in accepted:
        if lease.owner is not None:
            assert owners.setdefault(lease.epoch, lease.owner) == lease.owner


def test_a_statement_leaves_the_renewal_to_the_keeper_until_it_falls_behind():
    a = first_claim(H, "a", 0.0, ())
    due = LEASE_SECONDS - RENEW_WITHIN  # from here the keeper renews it (needs_renewal)
    assert a.needs_renewal(due + 0.1, 10)
    assert not a.must_renew_now(due + 0.1, 10)  # the keeper's batch renews it: no write per statement
    assert a.must_renew_now(LEASE_SECONDS - RENEW_WITHIN / 2 + 0.1, 10)  # the keeper is behind
    assert a.held_by("a", LEASE_SECONDS - RENEW_WITHIN / 2 + 0.1)  # ... and the lease still usable then
    assert a.must_renew_now(1.0, a.ceiling)  # its sequence block used up: at once, whatever the time
    assert not a.must_renew_now(1.0, a.ceiling - 1)
