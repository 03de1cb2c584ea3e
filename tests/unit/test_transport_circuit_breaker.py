"""The receive circuit breaker (core/transport/circuit_breaker.py): it trips once when failures
have gone on for its time, not before, and a success arms it again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.transport.circuit_breaker import TIME_TO_WAIT, ReceiveCircuitBreaker


def test_it_trips_once_after_its_time_and_a_success_arms_it_again() -> None:
    b = ReceiveCircuitBreaker(10.0)
    assert [b.failed(t) for t in (100.0, 105.0, 109.9)] == [False, False, False]
    assert b.failed(110.0) is True and b.failing_since == 100.0
    assert [b.failed(t) for t in (111.0, 500.0)] == [False, False]  # once, until receiving works
    b.succeeded()
    assert b.failures == 0 and b.failing_since is None
    assert b.failed(600.0) is False and b.failed(610.0) is True


def test_the_default_is_nservicebus_two_minutes() -> None:
    assert ReceiveCircuitBreaker().time_to_wait == TIME_TO_WAIT == 120.0


@pytest.mark.parametrize("bad", [-1, 86_401, True, float("nan")])
def test_a_bad_time_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="time_to_wait"):
        ReceiveCircuitBreaker(bad)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 50)), max_size=60), st.floats(0, 100))
def test_it_trips_exactly_when_a_run_of_failures_reaches_its_time(steps: list[tuple[bool, float]], wait: float) -> None:
    b = ReceiveCircuitBreaker(wait)
    now, since, tripped = 0.0, None, False
    for ok, dt in steps:
        now += dt
        if ok:
            b.succeeded()
            since, tripped = None, False
            continue
        since = now if since is None else since
        expect = not tripped and now - since >= wait
        tripped = tripped or expect
        assert b.failed(now) is expect
