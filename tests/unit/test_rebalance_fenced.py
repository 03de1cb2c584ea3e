"""A commit fenced by the queue group's rebalance (another reader joined or left while the
transaction was open): the committer names it RebalanceAbortedError, and RECEIVE outside a
transaction tries again rather than hand the caller an error for messages it never saw (a CI
run failed so: ILLEGAL_GENERATION as the queue's other reader closed). Fake producers: no broker."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kbroker.errors import RebalanceAbortedError, TransactionAbortedError
from kbroker.kafka.receive.receiver import Lease
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.kafka.txn.committer import GroupCommitter
from kbroker.sdk import fenced_retry
from tests.unit.test_committer_deadlines import FakeProducer, FakeReceiver


def committer_failing_offsets_with(code: int) -> GroupCommitter:
    release = threading.Event()
    release.set()

    class Fenced(FakeProducer):
        def send_offsets_to_transaction(self, *_a: Any) -> None:
            self._call("offsets")
            raise KafkaException(KafkaError(code, "Failed to commit offsets to transaction", txn_requires_abort=True))

    return GroupCommitter(
        "127.0.0.1:1",
        "ns",
        producers=1,
        timeout=0.3,
        transaction_deadline=0.3,
        new_producer=lambda conf: Fenced(conf, None, release),
    ).start()


@pytest.mark.parametrize(
    "code", [KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS]
)
def test_offsets_fenced_by_the_groups_generation_abort_as_a_rebalance(code):
    c = committer_failing_offsets_with(code)
    with pytest.raises(RebalanceAbortedError):
        c.commit(CommitRequest([], [Lease(FakeReceiver(), "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    c.close()


def test_other_offset_failures_are_not_called_a_rebalance():
    c = committer_failing_offsets_with(KafkaError._TIMED_OUT)
    with pytest.raises(TransactionAbortedError) as raised:
        c.commit(CommitRequest([], [Lease(FakeReceiver(), "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    assert not isinstance(raised.value, RebalanceAbortedError)
    c.close()


@pytest.fixture
def no_pause(monkeypatch):
    monkeypatch.setattr(fenced_retry, "PAUSE", 0.0)


def test_a_fenced_receive_is_tried_again_within_what_is_left_of_its_wait(no_pause):
    waits: list[float | None] = []

    def receive(left: float | None) -> str:
        waits.append(left)
        if len(waits) < 3:
            raise RebalanceAbortedError("fenced")
        return "messages"

    assert fenced_retry.receive_fenced_again(receive, 5.0, "q") == "messages"
    assert len(waits) == 3 and waits[0] == pytest.approx(5.0, abs=0.5)
    assert all(w is not None and 0 <= w <= 5.0 for w in waits)
    assert waits == sorted(waits, reverse=True)  # the wait shrinks, never restarts
    assert fenced_retry.receive_fenced_again(lambda left: left, None, "q") is None  # no time-out stays none


def test_a_receive_fenced_every_time_raises_after_the_last_try(no_pause):
    tries = []

    def receive(left: float | None) -> str:
        tries.append(left)
        raise RebalanceAbortedError("fenced")

    with pytest.raises(RebalanceAbortedError):
        fenced_retry.receive_fenced_again(receive, 1.0, "q")
    assert len(tries) == fenced_retry.RETRIES + 1


def test_other_aborts_are_not_tried_again(no_pause):
    tries = []

    def receive(left: float | None) -> str:
        tries.append(left)
        raise TransactionAbortedError("the broker is gone")

    with pytest.raises(TransactionAbortedError):
        fenced_retry.receive_fenced_again(receive, 1.0, "q")
    assert len(tries) == 1
