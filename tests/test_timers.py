"""BEGIN CONVERSATION TIMER and dialog LIFETIME: the pure schedule, then the timer service
against the real broker."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG, ERROR
from kbroker.core.endpoint import (
    CLOSED,
    CONVERSING,
    STARTED_OUTBOUND,
    Endpoint,
    handle_for,
)
from kbroker.core.timer_schedule import Entry, TimerSchedule
from kbroker.core.timers import firing_records
from kbroker.kafka.timer_service import TimerService

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


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 100), st.booleans()), max_size=200),
       st.integers(0, 100))
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
LIFETIME = {"kind": "lifetime", "due": 0, "conversation_id": CONV, "contract": CONTRACT,
            "INITIATOR": {"service": EMP, "topic": "qi", "key": "gi"},
            "TARGET": {"service": EXP, "topic": "qt", "key": "gt"}}


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


# --- against the real broker -------------------------------------------------------------------

@pytest.fixture
def timer_service(kafka_bootstrap, namespace, broker):
    svc = TimerService(kafka_bootstrap, namespace).start()
    yield svc
    svc.close()


def open_dialog(broker, **kw) -> tuple[str, str]:
    """A dialog whose target endpoint exists: (initiator handle, target handle)."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT, **kw)
    broker.send(h, CLAIM, {"n": 0})
    [m] = broker.receive("ExpenseQueue", top=1, wait=15)
    return h, m.conversation_handle


def test_dialog_timer_reaches_only_its_own_side_after_the_timeout(broker, timer_service):
    h, _ = open_dialog(broker)
    armed = time.time()
    broker.begin_conversation_timer(h, 2)
    [m] = broker.receive("EmployeeQueue", top=10, wait=15)
    assert time.time() - armed >= 2.0, "fired early"
    assert m.message_type_name == DIALOG_TIMER and m.body == b"" and m.conversation_handle == h
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []  # the peer is never told


def test_arming_again_replaces_the_timer(broker, timer_service):
    h, _ = open_dialog(broker)
    broker.begin_conversation_timer(h, 1)
    with broker.transaction() as tx:
        tx.begin_conversation_timer(h, 3)
    armed = time.time()
    got = broker.receive("EmployeeQueue", top=10, wait=15)
    assert [m.message_type_name for m in got] == [DIALOG_TIMER]
    assert time.time() - armed >= 2.5, "the replaced 1 s timer fired"
    assert broker.receive("EmployeeQueue", top=10, wait=2) == []  # exactly one DialogTimer


def test_a_rolled_back_timer_is_never_armed(broker, timer_service):
    h, _ = open_dialog(broker)
    tx = broker.transaction()
    tx.begin_conversation_timer(h, 0.5)
    tx.rollback()
    assert broker.receive("EmployeeQueue", top=10, wait=3) == []


def test_timers_survive_the_service_and_fire_once(kafka_bootstrap, namespace, broker):
    h, _ = open_dialog(broker)
    broker.begin_conversation_timer(h, 1)
    time.sleep(1.5)  # due while no service runs
    with TimerService(kafka_bootstrap, namespace) as first:
        [m] = broker.receive("EmployeeQueue", top=10, wait=15)
        assert m.message_type_name == DIALOG_TIMER
        assert first.fired == 1
    with TimerService(kafka_bootstrap, namespace) as second:
        assert broker.receive("EmployeeQueue", top=10, wait=3) == []
        assert second.fired == 0 and len(second.schedule) == 0


def test_dialog_timer_is_received_before_the_dialogs_other_messages(broker, timer_service):
    h, th = open_dialog(broker)
    for i in range(3):
        with broker.transaction() as tx:
            tx.send(th, "//Adventure-Works.com/Expenses/ExpenseApproval", {"n": i})
    broker.begin_conversation_timer(h, 0.5)
    deadline = time.time() + 15
    while timer_service.fired == 0 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the DialogTimer is on the queue behind the three replies
    got = broker.receive("EmployeeQueue", top=10, wait=15)
    assert [m.message_type_name for m in got][0] == DIALOG_TIMER
    assert [m.message_sequence_number for m in got[1:]] == [0, 1, 2]


def test_lifetime_expiry_errors_both_sides_and_refuses_sends(broker, timer_service):
    h, th = open_dialog(broker, lifetime=5)  # open_dialog must finish first: int seconds, so 4-5 s
    [ti] = broker.receive("EmployeeQueue", top=10, wait=15)
    [tt] = broker.receive("ExpenseQueue", top=10, wait=15)
    for m, handle in ((ti, h), (tt, th)):
        assert m.message_type_name == ERROR and m.conversation_handle == handle
        assert b"<Code>-8489</Code>" in m.body
    for handle, mtype in ((h, CLAIM), (th, "//Adventure-Works.com/Expenses/ExpenseApproval")):
        with pytest.raises(errors.ConversationClosedError):
            broker.send(handle, mtype, {"late": True})
    broker.end_conversation(h)
    broker.end_conversation(th)
    assert {broker.endpoints.get(x).state for x in (h, th)} == {CLOSED}


def test_the_target_refuses_sends_after_the_lifetime_even_before_the_error_arrives(broker):
    h, th = open_dialog(broker, lifetime=1)
    time.sleep(1.5)
    with pytest.raises(errors.ConversationClosedError):
        broker.send(th, "//Adventure-Works.com/Expenses/ExpenseApproval", {"late": True})


def test_a_dialog_ended_before_its_lifetime_gets_no_error(broker, timer_service):
    start = time.time()
    h, th = open_dialog(broker, lifetime=5)
    broker.end_conversation(th)
    got = broker.receive("EmployeeQueue", top=10, wait=15)
    assert [m.message_type_name for m in got] == [END_DIALOG], f"ended after {time.time() - start:.1f} s"
    broker.end_conversation(h)
    time.sleep(max(0.0, start + 6.5 - time.time()))
    assert broker.receive("EmployeeQueue", top=10, wait=1) == []
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []


@pytest.mark.parametrize("timeout", [0, -1, "5", True, 2**31])
def test_bad_timer_timeouts_are_refused(broker, timeout):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    with pytest.raises(ValueError):
        broker.begin_conversation_timer(h, timeout)


def test_timer_on_an_ended_or_unknown_conversation_is_refused(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.end_conversation(h)
    with pytest.raises(errors.ConversationClosedError):
        broker.begin_conversation_timer(h, 5)
    with pytest.raises(errors.ConversationNotFoundError):
        broker.begin_conversation_timer("00000000-0000-0000-0000-000000000000", 5)
