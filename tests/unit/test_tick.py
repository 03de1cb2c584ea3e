"""The tick schedule and the once-per-cluster tick owner, on a fake clock."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.activation.tick import (
    EVERY_2ND,
    EVERY_5TH,
    EVERY_TICK,
    TickCounter,
    TickOwner,
    TickRun,
    TickSchedule,
    advance,
    claim,
    release,
)

ALL = {EVERY_TICK, EVERY_2ND, EVERY_5TH}


def test_task_sets_every_1st_2nd_5th():
    s = TickSchedule()
    assert s.due(1) == {EVERY_TICK}
    assert s.due(2) == {EVERY_TICK, EVERY_2ND}
    assert s.due(5) == {EVERY_TICK, EVERY_5TH}
    assert s.due(10) == ALL
    runs = [s.due(n) for n in range(1, 31)]
    assert sum(EVERY_TICK in d for d in runs) == 30
    assert sum(EVERY_2ND in d for d in runs) == 15
    assert sum(EVERY_5TH in d for d in runs) == 6


def test_tick_numbers_follow_the_wall_clock_grid():
    s = TickSchedule(interval=5.0)
    assert [s.number(t) for t in (0, 4.999, 5.0, 9.9, 10.0)] == [0, 0, 1, 1, 2]
    assert s.starts_at(s.number(12.3) + 1) == 15.0
    assert TickSchedule(interval=2.0).number(7.0) == 3
    with pytest.raises(ValueError):
        TickSchedule(interval=0)


def test_timer_on_time_runs_each_tick_once():
    s, c, runs = TickSchedule(), TickCounter(), []
    for t in (100.1, 103.0, 105.2, 110.0, 110.0, 114.9, 115.0):
        c, run = advance(c, t, s)
        if run:
            runs.append(run)
    assert [r.number for r in runs] == [20, 21, 22, 23]
    assert runs[0].due == ALL  # 20: the first run ever does only what is due at its number
    assert runs[1] == TickRun(21, frozenset({EVERY_TICK}), missed=0)
    assert runs[2].due == {EVERY_TICK, EVERY_2ND}


def test_late_timer_folds_missed_ticks_into_one_run():
    s = TickSchedule()
    c, _ = advance(TickCounter(), 100.0, s)  # tick 20
    c, run = advance(c, 103.0 + 60, s)  # paused a minute: now tick 32
    assert run.number == 32 and run.missed == 11
    assert run.due == ALL  # 25 and 30 fell in the gap: the 5th-tick set runs once
    c, run = advance(c, 165.1, s)  # 33: back to normal, no burst
    assert run == TickRun(33, frozenset({EVERY_TICK}), 0)


def test_late_by_one_tick_carries_the_skipped_2nd():
    s = TickSchedule()
    c = TickCounter(last=21)
    c, run = advance(c, 23 * 5.0, s)  # 22 missed
    assert run.missed == 1 and run.due == {EVERY_TICK, EVERY_2ND}


@given(st.integers(-5, 10_000), st.integers(1, 200))
def test_due_between_is_the_union_of_due(last, gap):
    s = TickSchedule()
    union = set().union(*(s.due(n) for n in range(last + 1, last + gap + 1)))
    assert s.due_between(last, last + gap) == union


# ---- once per cluster -----------------------------------------------------------------------


def test_owner_runs_and_renews_others_wait():
    s, rec = TickSchedule(), TickOwner()
    run, rec = claim(rec, "a", 100.0, s)
    assert run.number == 20 and rec == TickOwner("a", 115.0, 20)
    run, rec2 = claim(rec, "b", 105.5, s)
    assert run is None and rec2 == rec  # b does not even touch the record
    run, rec = claim(rec, "a", 105.2, s)
    assert run.number == 21 and rec.expires_at == 120.2


def test_dead_owner_is_taken_over_after_the_lease_and_gap_is_folded():
    s = TickSchedule()
    _, rec = claim(TickOwner(), "a", 100.0, s)  # a runs 20 then dies
    assert claim(rec, "b", 114.9, s)[0] is None
    run, rec = claim(rec, "b", 115.0, s)
    assert rec.owner == "b" and run.number == 23 and run.missed == 2
    assert run.due == {EVERY_TICK, EVERY_2ND}  # 22 was missed


def test_release_hands_over_at_once():
    s = TickSchedule()
    _, rec = claim(TickOwner(), "a", 100.0, s)
    assert release(rec, "b") == rec
    rec = release(rec, "a")
    run, rec = claim(rec, "b", 105.0, s)
    assert run.number == 21 and rec.owner == "b"


def test_owner_record_round_trips():
    rec = TickOwner("worker-1", 115.5, 22)
    assert TickOwner.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    assert TickOwner.from_dict(None) == TickOwner()


def simulate(timers, schedule=TickSchedule()):  # noqa: B008 - a frozen dataclass, shared safely
    """Apply every worker's timer firings to one record, serially in time order (as the
    single-partition log does). Returns {tick number: (worker, run)}."""
    rec, ran = TickOwner(), {}
    for t, worker in sorted(timers):
        run, rec = claim(rec, worker, t, schedule)
        if run:
            assert run.number not in ran, f"tick {run.number} ran twice"
            ran[run.number] = (worker, run)
    return ran


def covered(ran):
    """Tick numbers run or folded into a run; asserts the ranges are disjoint."""
    seen = set()
    for n, (_, run) in ran.items():
        span = set(range(n - run.missed, n + 1))
        assert not (span & seen)
        seen |= span
    return seen


def test_two_workers_interleaving_each_tick_runs_exactly_once():
    # a fires at x.3 s past each 5 s boundary, b at x.7; a dies at t=300, comes back at 400.
    timers = [(5 * k + 0.3, "a") for k in range(200) if not 300 <= 5 * k < 400]
    timers += [(5 * k + 2.7, "b") for k in range(200)]
    ran = simulate(timers)
    numbers = sorted(ran)
    assert covered(ran) == set(range(numbers[0], numbers[-1] + 1))
    owners = [ran[n][0] for n in numbers]
    assert owners[0] == "a" and "b" in owners
    # Sticky: once b took over it keeps the ticks; a coming back does not steal them.
    first_b = owners.index("b")
    assert set(owners[first_b:]) == {"b"}
    # The takeover folded a's missed ticks into b's first run, no burst.
    assert ran[numbers[first_b]][1].missed >= 1


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.floats(0, 500, allow_nan=False), st.sampled_from(["a", "b", "c"])),
        max_size=200,
    ),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(-3, 3, allow_nan=False)),
)
def test_any_interleaving_and_clock_skew_never_runs_a_tick_twice(firings, skew):
    # Each worker's clock may be off by a few seconds; claims are still applied in log order.
    rec, ran = TickOwner(), set()
    for t, w in firings:
        run, rec = claim(rec, w, t + skew.get(w, 0.0))
        if run:
            span = set(range(run.number - run.missed, run.number + 1))
            assert not (span & ran)
            ran |= span
