"""NServiceBus 2.1-style ramp-up controller for polling consumers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.activation.ramp import GROW_AFTER, SHRINK_AFTER, RampUp


def feed(r, polls):
    deltas = []
    for got in polls:
        r, d = r.observe(got)
        deltas.append(d)
    return r, deltas


def test_defaults_are_the_21_thresholds():
    assert (GROW_AFTER, SHRINK_AFTER) == (6, 3)
    r = RampUp(max_readers=4)
    assert (r.readers, r.grow_after, r.shrink_after) == (1, 6, 3)


def test_sixth_consecutive_success_adds_a_poller():
    r, deltas = feed(RampUp(max_readers=4), [True] * 5)
    assert deltas == [0] * 5 and r.readers == 1
    r, d = r.observe(True)
    assert d == +1 and r.readers == 2 and r.successes == 0


def test_an_empty_poll_resets_the_success_run():
    r, deltas = feed(RampUp(max_readers=4), [True] * 5 + [False] + [True] * 5)
    assert r.readers == 1 and set(deltas) == {0}
    r, d = r.observe(True)
    assert d == +1


def test_grows_one_at_a_time_up_to_the_maximum():
    r, deltas = feed(RampUp(max_readers=3), [True] * 60)
    assert r.readers == 3 and deltas.count(+1) == 2
    assert [i for i, d in enumerate(deltas) if d] == [5, 11]
    assert r.successes <= r.grow_after  # saturated, not growing for ever


def test_third_consecutive_empty_poll_retires_one_down_to_one():
    r = RampUp(max_readers=4, readers=3)
    r, deltas = feed(r, [False] * 2)
    assert r.readers == 3 and deltas == [0, 0]
    r, d = r.observe(False)
    assert d == -1 and r.readers == 2 and r.failures == 0
    r, deltas = feed(r, [False] * 30)
    assert r.readers == 1 and deltas.count(-1) == 1
    assert r.failures <= r.shrink_after


def test_a_message_resets_the_failure_run():
    r, deltas = feed(RampUp(max_readers=4, readers=2), [False, False, True, False, False])
    assert r.readers == 2 and set(deltas) == {0}


def test_custom_thresholds():
    r, deltas = feed(RampUp(max_readers=2, grow_after=2, shrink_after=1), [True, True, False])
    assert deltas == [0, +1, -1]


def test_lowering_the_maximum_stops_the_excess():
    r = RampUp(max_readers=8, readers=5)
    r2, d = r.with_max(2)
    assert (r2.readers, d) == (2, -3)
    r3, d = r.with_max(10)
    assert (r3.readers, d) == (5, 0)


def test_invalid_settings():
    with pytest.raises(ValueError):
        RampUp(max_readers=0)
    with pytest.raises(ValueError):
        RampUp(max_readers=2, grow_after=0)


@given(st.integers(1, 10), st.lists(st.booleans(), max_size=300))
def test_readers_stay_between_one_and_the_maximum(maximum, polls):
    r = RampUp(max_readers=maximum)
    for got in polls:
        before = r.readers
        r, d = r.observe(got)
        assert 1 <= r.readers <= maximum
        assert r.readers == before + d and d in (-1, 0, 1)
        assert d != +1 or got  # only a success grows, only an empty poll shrinks
        assert d != -1 or not got
