"""BEGIN CONVERSATION TIMER and dialog LIFETIME, the pure parts: the timer schedule and who gets
what when a timer fires. The timer service against the real broker is in
tests/integration/test_timers.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kbroker.cli.demo import CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    CONVERSING,
    STARTED_OUTBOUND,
    Endpoint,
    handle_for,
)
from kbroker.core.dialogs.timer_schedule import Entry, TimerSchedule
from kbroker.core.dialogs.timers import firing_records

# --- the schedule (pure) -----------------------------------------------------------------------


def entry(key: str, due: float, partition: int = 0) -> Entry:
    return Entry(key, due, partition, 0, {"k": key})


def test_a_later_arm_of_a_key_replaces_the_earlier_one():
    s = TimerSchedule()
    s.put(entry("a", 10))
    s.put(entry("a", 30))
    assert s.pop_due(20) == []
    assert [e.due for e in s.pop_due(30)] == [30]
    assert len(s) == 0


def test_removed_and_revoked_entries_never_fire():
    s = TimerSchedule()
    s.put(entry("a", 1, partition=0))
    s.put(entry("b", 1, partition=1))
    s.put(entry("c", 1, partition=2))
    s.remove("a")
    s.drop_partitions({1})
    assert [e.key for e in s.pop_due(5)] == ["c"]
    assert s.next_due() is None


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 100), st.booleans()), max_size=200),
    st.integers(0, 100),
)
def test_pop_due_returns_exactly_the_live_due_entries_in_order(ops, now):
    s, live = TimerSchedule(), {}
    for key, due, is_remove in ops:
        if is_remove:
            s.remove(key)
            live.pop(key, None)
        else:
            s.put(entry(key, due))
            live[key] = due
    got = s.pop_due(now, limit=10_000)
    assert sorted((e.key, e.due) for e in got) == sorted((k, d) for k, d in live.items() if d <= now)
    assert [e.due for e in got] == sorted(e.due for e in got)
    assert len(s) == sum(1 for d in live.values() if d > now)
    assert len(s._heap) <= max(64, 2 * len(s)) + 1  # stale heap items do not pile up


# --- who gets what when a timer fires (pure) -------------------------------------------------

CONV = "5d3c5f4e-0000-4000-8000-000000000001"
LIFETIME = {
    "kind": "lifetime",
    "due": 0,
    "conversation_id": CONV,
    "contract": CONTRACT,
    "INITIATOR": {"service": EMP, "topic": "qi", "key": "gi"},
    "TARGET": {"service": EXP, "topic": "qt", "key": "gt"},
}


def ep(side: str, state: str) -> Endpoint:
    return Endpoint(handle_for(CONV, side), CONV, side, "g", "g", EMP, EXP, CONTRACT, state)


def test_lifetime_expiry_reaches_both_open_sides_with_error_8489():
    eps = {e.conversation_handle: e for e in (ep("INITIATOR", CONVERSING), ep("TARGET", CONVERSING))}
    records = firing_records(LIFETIME, eps.get)
    assert [(t, k) for t, k, _, _ in records] == [("qi", "gi"), ("qt", "gt")]
    assert all(b"<Code>-8489</Code>" in v for _, _, v, _ in records)


def test_lifetime_expiry_skips_closed_sides_and_a_target_never_told():
    never_sent = {handle_for(CONV, "INITIATOR"): ep("INITIATOR", STARTED_OUTBOUND)}
    assert [t for t, *_ in firing_records(LIFETIME, never_sent.get)] == ["qi"]
    sent_not_received = {handle_for(CONV, "INITIATOR"): ep("INITIATOR", CONVERSING)}
    assert [t for t, *_ in firing_records(LIFETIME, sent_not_received.get)] == ["qi", "qt"]
    closed = {e.conversation_handle: e for e in (ep("INITIATOR", CLOSED), ep("TARGET", CLOSED))}
    assert firing_records(LIFETIME, closed.get) == []
