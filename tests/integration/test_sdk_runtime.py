"""The SDK facade over the real broker: receive hooks, typed argument errors, and the runtime a
Transaction is built on."""

from __future__ import annotations

import pytest

from kbroker.errors import InvalidArgumentError
from kbroker.sdk.broker import Broker
from kbroker.sdk.hooks import ReceiveHooks

EMPLOYEES = "//Adventure-Works.com/Employees"
EXPENSES = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"


class Recorder(ReceiveHooks):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def before_receive(self, queue: str) -> None:
        self.calls.append(("before", queue))

    def after_receive(self, queue: str, count: int) -> None:
        self.calls.append(("after", queue, count))

    def after_rollback(self, queue: str) -> None:
        self.calls.append(("rollback", queue))


class Failing(ReceiveHooks):
    def after_receive(self, queue: str, count: int) -> None:
        raise RuntimeError("monitor down")


def test_hooks_see_receives_and_rollbacks_and_a_failing_hook_is_harmless(broker: Broker) -> None:
    recorder = Recorder()
    broker.hooks.extend([Failing(), recorder])
    handle = broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT)
    broker.send(handle, CLAIM, {"amount": 1})
    tx = broker.transaction()
    assert len(tx.receive("ExpenseQueue", wait=15)) == 1  # Failing raised in between: logged only
    tx.rollback()
    assert recorder.calls[0] == ("before", "ExpenseQueue")
    assert recorder.calls[-2:] == [("after", "ExpenseQueue", 1), ("rollback", "ExpenseQueue")]
    assert len(broker.receive("ExpenseQueue", wait=15)) == 1  # the rolled-back message came back


def test_bad_arguments_are_refused_before_anything_is_sent(broker: Broker) -> None:
    handle = broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT)
    with pytest.raises(InvalidArgumentError, match="priority"):
        broker.send(handle, CLAIM, {}, priority=0)
    with pytest.raises(InvalidArgumentError, match="top"):
        broker.receive("ExpenseQueue", top=0)
    with pytest.raises(InvalidArgumentError, match="lifetime"):
        broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT, lifetime=-1)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        broker.begin_conversation_timer(handle, -3)
    assert broker.receive("ExpenseQueue", wait=1) == []  # nothing reached the queue
