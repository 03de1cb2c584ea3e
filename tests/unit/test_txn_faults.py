"""The committer's pure decisions after a failed or overrun Kafka transaction call."""

from __future__ import annotations

import pytest

from kbroker.core.txn.faults import Action, Deadline, Failure, Stage, committed_by_offsets, decide

BEFORE_COMMIT = [Stage.BEGIN, Stage.PRODUCE, Stage.OFFSETS]


@pytest.mark.parametrize("stage", BEFORE_COMMIT)
def test_a_call_stuck_before_commit_replaces_the_producer_and_cannot_have_committed(stage):
    action = decide(Failure(stage, timed_out=True), time_left=5.0)
    assert action is Action.REPLACE  # not RESOLVE: it cannot have committed


@pytest.mark.parametrize("stage", BEFORE_COMMIT)
def test_an_error_before_commit_aborts_on_the_same_producer(stage):
    assert decide(Failure(stage, retriable=True), 5.0) is Action.ABORT
    assert decide(Failure(stage, requires_abort=True), 5.0) is Action.ABORT


@pytest.mark.parametrize("stage", BEFORE_COMMIT)
def test_a_fatal_error_before_commit_replaces_the_producer(stage):
    assert decide(Failure(stage, fatal=True, requires_abort=True), 5.0) is Action.REPLACE


@pytest.mark.parametrize("stage", [Stage.INIT, Stage.ABORT])
def test_a_producer_that_cannot_start_or_abort_is_replaced(stage):
    assert decide(Failure(stage, retriable=True), 5.0) is Action.REPLACE
    assert decide(Failure(stage, timed_out=True), 5.0) is Action.REPLACE


def test_a_commit_that_did_not_answer_is_in_doubt():
    action = decide(Failure(Stage.COMMIT, timed_out=True), 5.0)
    assert action is Action.RESOLVE


def test_a_fenced_commit_is_in_doubt_not_aborted():
    # A fatal error during commit may come after the coordinator wrote the commit decision.
    assert decide(Failure(Stage.COMMIT, fatal=True), 5.0) is Action.RESOLVE


def test_a_commit_the_coordinator_refused_aborts():
    assert decide(Failure(Stage.COMMIT, requires_abort=True), 5.0) is Action.ABORT


def test_a_retriable_commit_error_asks_again_while_time_is_left():
    assert decide(Failure(Stage.COMMIT, retriable=True), 5.0) is Action.RETRY_COMMIT
    assert decide(Failure(Stage.COMMIT, retriable=True), 0.0) is Action.RESOLVE


def test_an_unclassified_commit_error_is_in_doubt():
    assert decide(Failure(Stage.COMMIT), 5.0) is Action.RESOLVE


def test_offsets_settle_an_in_doubt_transaction():
    sent = [("q", 0, 10, "m1"), ("q", 1, 4, None)]
    assert committed_by_offsets(sent, [("q", 1, 4, ""), ("q", 0, 10, "m1")])
    assert not committed_by_offsets(sent, [("q", 0, 9, "m0"), ("q", 1, 4, None)])
    assert not committed_by_offsets(sent, [("q", 0, 10, "m2"), ("q", 1, 4, None)])  # other completed set
    assert not committed_by_offsets(sent, [("q", 1, 4, None)])  # a partition missing: not committed


def test_a_transaction_without_offsets_cannot_be_settled_by_them():
    with pytest.raises(ValueError):
        committed_by_offsets([], [])


def test_deadline_counts_down_on_its_clock_and_bounds_each_call():
    now = [100.0]
    d = Deadline(10.0, clock=lambda: now[0])
    assert d.left() == 10.0 and not d.expired()
    assert d.call_timeout(30.0) == 10.0
    assert d.call_timeout(3.0) == 3.0
    now[0] = 109.95
    assert d.call_timeout(30.0) == 0.1  # never a zero timeout
    now[0] = 111.0
    assert d.expired() and d.left() == 0.0
    assert d.call_timeout(30.0, floor=1.0) == 1.0
