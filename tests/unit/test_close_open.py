"""Closing an open Kafka transaction a broker restart may have left (kafka/txn/close_open.py), with
fake producers: an in-doubt commit whose offsets never become readable is settled by Kafka's
transaction log and closed the way it ended; a transaction Kafka fenced for the group's
generation (the broker was well) gets no closing transaction."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kbroker.core.txn.transaction_log import OFFSETS_TOPIC, TxnLogEntry, TxnState
from kbroker.errors import (
    PermissionDeniedError,
    RebalanceAbortedError,
    TransactionAbortedError,
    TransactionInDoubtError,
)
from kbroker.kafka.receive.receiver import Lease
from kbroker.kafka.txn import settling as settling_module
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.kafka.txn.committer import GroupCommitter
from tests.unit.test_committer_deadlines import FakeProducer, FakeReceiver, committer_whose_first_producer_is

S = TxnState


def history(decision: TxnState) -> list[TxnLogEntry]:
    """The log of a transaction on ("t", 1) and the offsets topic, decided `decision` (markers
    never written: the log does not show that), then the settling producer's init."""
    parts = frozenset({("t", 1), (OFFSETS_TOPIC, 7)})
    return [
        TxnLogEntry(3, 0, S.EMPTY),
        TxnLogEntry(3, 0, S.ONGOING, parts),
        TxnLogEntry(3, 0, decision, parts),
        TxnLogEntry(3, 0, S.COMPLETE_COMMIT if decision is S.PREPARE_COMMIT else S.COMPLETE_ABORT),
        TxnLogEntry(3, 1, S.EMPTY),
    ]


def in_doubt_committer(monkeypatch: pytest.MonkeyPatch, log: Any) -> tuple[GroupCommitter, list[FakeProducer]]:
    """A committer whose first producer's commit hangs (in doubt), whose group offsets never
    answer (an open transaction), and whose transaction log says `log` (a list, or an exception)."""

    def transaction_history(*_a: Any) -> Any:
        if isinstance(log, Exception):
            raise log
        return log

    monkeypatch.setattr(settling_module, "transaction_history", transaction_history)
    c, made = committer_whose_first_producer_is(
        FakeProducer, threading.Event(), "commit", resolve_timeout=2.0, open_transaction_after=0.2
    )

    def unreadable(*_a: Any) -> Any:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets: Local: Timed out"))

    c._settler.group_offsets = unreadable  # type: ignore[method-assign]
    return c.start(), made


def request() -> CommitRequest:
    return CommitRequest([("t", b"k", b"v", None)], [Lease(FakeReceiver(), "g", None, offsets=[(0, 6)])])  # type: ignore[arg-type]


def test_an_in_doubt_commit_the_log_shows_committed_is_closed_as_committed(monkeypatch):
    c, made = in_doubt_committer(monkeypatch, history(S.PREPARE_COMMIT))
    c.commit(request())  # committed: the reader must not get its messages again
    assert made[0].calls[-1] == "commit"  # nothing more on the producer whose commit may be running
    assert made[1].calls == ["init", "begin", "offsets", "commit"]  # the same offsets, committed again
    c.close()


def test_an_in_doubt_commit_the_log_shows_aborted_is_closed_as_aborted(monkeypatch):
    c, made = in_doubt_committer(monkeypatch, history(S.PREPARE_ABORT))
    with pytest.raises(TransactionAbortedError):
        c.commit(request())
    # Topic t's two partitions (the log's ("t", 1) among them), the offsets, aborted; then a
    # fresh producer for what follows.
    closing = next(p for p in made[1:] if "abort" in p.calls)
    assert closing.calls == ["init", "list_topics", "begin", "produce", "produce", "offsets", "abort"]
    c.commit(CommitRequest([("t", b"k", b"v", None)], []))
    assert made[-1].calls[-2:] == ["produce", "commit"]
    c.close()


def test_without_the_log_an_unreadable_commit_stays_in_doubt_and_nothing_is_closed(monkeypatch):
    c, made = in_doubt_committer(
        monkeypatch,
        PermissionDeniedError(
            resource="topic __transaction_state", operation="READ", principal="User:app", what="reading"
        ),
    )
    with pytest.raises(TransactionInDoubtError):
        c.commit(request())
    assert all("abort" not in p.calls and p.calls.count("commit") <= 1 for p in made)
    c.close()


def test_a_transaction_fenced_by_the_groups_generation_gets_no_closing_transaction():
    class Fenced(FakeProducer):
        def send_offsets_to_transaction(self, *_a: Any) -> None:
            self._call("offsets")
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "generation moved on"))

    c, made = committer_whose_first_producer_is(Fenced, threading.Event())
    c.start()
    with pytest.raises(RebalanceAbortedError):
        c.commit(request())
    c.commit(CommitRequest([("t", b"k", b"v", None)], []))
    assert made[1].calls == ["init", "begin", "produce", "commit"]  # straight to work
    c.close()
