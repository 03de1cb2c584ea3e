"""A dialog side's class (core/analytics/dialog_class.py): the first-match order of docs/analytics.md and
its boundaries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.analytics.dialog_class import BACKLOGGED_AT, DialogFacts, classify

NOW = 10_000_000


def facts(**kw: object) -> DialogFacts:
    return DialogFacts(**{"now_ms": NOW, "window_s": 60.0, "stale_after_s": 30.0, **kw})  # type: ignore[arg-type]


def klass(**kw: object) -> str:
    return classify(facts(**kw))[0]


def test_backlogged_at_is_ten():
    assert BACKLOGGED_AT == 10


def test_each_class_on_its_own():
    assert klass(last_error_ms=NOW - 1_000) == "erroring"
    assert klass(backlog=1, oldest_ms=NOW - 31_000) == "stale"
    assert klass(backlog=10, oldest_ms=NOW - 1_000) == "backlogged"
    assert klass(last_arrival_ms=NOW - 1_000) == "active"
    assert klass(last_receive_ms=NOW - 1_000) == "active"
    assert klass(timers=1) == "timer_pending"
    assert klass() == "idle"


def test_first_match_wins():
    everything = {
        "last_error_ms": NOW,
        "backlog": 50,
        "oldest_ms": NOW - 100_000,
        "last_arrival_ms": NOW,
        "last_receive_ms": NOW,
        "timers": 2,
    }
    assert klass(**everything) == "erroring"
    assert klass(**everything | {"last_error_ms": None}) == "stale"
    assert klass(**everything | {"last_error_ms": None, "oldest_ms": NOW - 1_000}) == "backlogged"
    assert klass(**everything | {"last_error_ms": None, "oldest_ms": NOW - 1_000, "backlog": 9}) == "active"
    assert (
        klass(
            timers=2,
            backlog=9,
            oldest_ms=NOW - 29_999,
            last_arrival_ms=NOW - 60_001,
            last_receive_ms=NOW - 61_000,
            last_error_ms=NOW - 70_000,
        )
        == "timer_pending"
    )


def test_stale_exactly_at_the_threshold():
    assert klass(backlog=1, oldest_ms=NOW - 30_000) == "stale"
    assert klass(backlog=1, oldest_ms=NOW - 29_999) == "idle"
    assert klass(backlog=1, oldest_ms=NOW - 5_000, stale_after_s=5.0) == "stale"  # the queue's own threshold
    assert klass(backlog=1, oldest_ms=NOW - 4_999, stale_after_s=5.0) == "idle"


def test_stale_needs_an_unreceived_message():
    assert klass(backlog=0, oldest_ms=None, last_receive_ms=NOW - 100_000) == "idle"


def test_backlogged_from_ten_unreceived():
    assert klass(backlog=BACKLOGGED_AT, oldest_ms=NOW) == "backlogged"
    assert klass(backlog=BACKLOGGED_AT - 1, oldest_ms=NOW) == "idle"


def test_recent_means_within_one_window_inclusive():
    assert klass(last_error_ms=NOW - 60_000) == "erroring"
    assert klass(last_error_ms=NOW - 60_001) == "idle"
    assert klass(last_arrival_ms=NOW - 60_000) == "active"
    assert klass(last_arrival_ms=NOW - 60_001) == "idle"
    assert klass(last_receive_ms=NOW - 10_000, window_s=10.0) == "active"
    assert klass(last_receive_ms=NOW - 10_001, window_s=10.0) == "idle"


def test_the_reason_says_why():
    cls, reason = classify(facts(backlog=1, oldest_ms=NOW - 42_500))
    assert cls == "stale" and "30 s" in reason and "42.5" not in reason  # an age would be frozen in the record
    cls, reason = classify(facts(backlog=12, oldest_ms=NOW))
    assert cls == "backlogged" and reason.startswith("12 ")


moments = st.one_of(st.none(), st.integers(NOW - 200_000, NOW))


@given(st.integers(0, 30), moments, moments, moments, moments, st.integers(0, 2))
def test_the_order_of_docs_analytics_md(backlog, oldest, arrived, received, errored, timers):
    f = facts(
        backlog=backlog,
        oldest_ms=oldest if backlog else None,
        last_arrival_ms=arrived,
        last_receive_ms=received,
        last_error_ms=errored,
        timers=timers,
    )

    def recent(at: int | None) -> bool:
        return at is not None and NOW - at <= 60_000

    expected = next(
        name
        for name, holds in [
            ("erroring", recent(errored)),
            ("stale", backlog > 0 and oldest is not None and NOW - oldest >= 30_000),
            ("backlogged", backlog >= 10),
            ("active", recent(arrived) or recent(received)),
            ("timer_pending", timers > 0),
            ("idle", True),
        ]
        if holds
    )
    assert classify(f)[0] == expected
