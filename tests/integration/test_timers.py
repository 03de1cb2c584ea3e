"""BEGIN CONVERSATION TIMER and dialog LIFETIME: the timer service against the real broker (the pure
schedule and firing rules are tested in tests/unit/test_timer_schedule.py)."""

from __future__ import annotations

import time

import pytest

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG, ERROR
from kbroker.core.dialogs.conversation_endpoint import CLOSED
from kbroker.kafka.dialogs.timer_service import TimerService


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
    time.sleep(max(0.0, broker.endpoints.get(th).lifetime - time.time()) + 0.2)  # whole seconds, rounded up
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
