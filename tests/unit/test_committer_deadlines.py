"""The group committer with producers that hang: it stops waiting at its own deadline, never
calls a stuck producer again, replaces it under the same transactional.id, and fails the batch
(retriable) or settles an in-doubt commit from the group's offsets. Fake producers: no broker."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.core.txn.commit_holder import with_holder
from kbroker.errors import TransactionAbortedError, TransactionInDoubtError
from kbroker.kafka.receive.receiver import Lease
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.kafka.txn.committer import GroupCommitter


class FakeProducer:
    """Records its calls; the call named `hang_in` blocks until `release` is set."""

    def __init__(self, conf: dict[str, Any], hang_in: str | None, release: threading.Event):
        self.txn_id = conf["transactional.id"]
        self.calls: list[str] = []
        self._hang_in, self._release = hang_in, release

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self._hang_in:
            self._release.wait()

    def init_transactions(self, _t: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, *_a: Any, **_kw: Any) -> None:
        self._call("produce")

    def send_offsets_to_transaction(self, *_a: Any) -> None:
        self._call("offsets")

    def commit_transaction(self, _t: float) -> None:
        self._call("commit")

    def abort_transaction(self, _t: float) -> None:
        self._call("abort")

    def poll(self, _t: float = 0) -> int:
        return 0  # serves delivery reports after a failure: none here

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """The cluster has topic t, of two partitions (what a closing transaction writes to)."""
        self._call("list_topics")
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions={0: None, 1: None})})


class FakeReceiver:
    topic = "q"

    def __init__(self) -> None:
        self.excluded = 0

    def include(self, leases: list[Lease]) -> list[TopicPartition]:
        return [TopicPartition("q", 0, 7, metadata="m")]

    def exclude(self, leases: list[Lease]) -> None:
        self.excluded += 1

    def group_metadata(self) -> object:
        return object()


@pytest.fixture
def release() -> Any:
    event = threading.Event()
    yield event
    event.set()  # let the abandoned producers' threads end


def committer_whose_first_producer_is(
    first: type[FakeProducer], release: threading.Event, hang_in: str | None = None, **settings: Any
) -> tuple[GroupCommitter, list[FakeProducer]]:
    """A committer of one ring slot with short deadlines, not started, whose first producer is a
    `first` (hanging in `hang_in`, if named) and whose replacements work; the producers made."""
    made: list[FakeProducer] = []

    def new_producer(conf: dict[str, Any]) -> Any:
        p = first(conf, hang_in, release) if not made else FakeProducer(conf, None, release)
        made.append(p)
        return p

    c = GroupCommitter(
        "127.0.0.1:1",
        "ns",
        **{"producers": 1, "timeout": 0.3, "transaction_deadline": 0.3, **settings},
        new_producer=new_producer,
    )
    c._settler.group_metadata = lambda group: object()  # type: ignore[method-assign]
    return c, made


def committer_with(hang_in: str, release: threading.Event) -> tuple[GroupCommitter, list[FakeProducer]]:
    c, made = committer_whose_first_producer_is(FakeProducer, release, hang_in)
    return c.start(), made


# What a slot's next producer runs first after a transaction that failed with the broker away:
# a transaction closing it as aborted (kafka/txn/close_open.py), records on every partition of its
# topics and its offsets; then that producer is replaced too.
CLOSING = ["init", "begin", "offsets", "abort"]


def test_a_hung_send_offsets_fails_the_batch_retriably_and_replaces_the_producer(release):
    c, made = committer_with("offsets", release)
    receiver = FakeReceiver()
    started = time.monotonic()
    with pytest.raises(TransactionAbortedError):
        c.commit(CommitRequest([], [Lease(receiver, "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    assert time.monotonic() - started < 5, "the committer waited past its deadline"
    assert receiver.excluded == 1  # the offsets are incomplete again: the messages come back
    assert len(made) >= 3 and made[1].txn_id == made[2].txn_id == made[0].txn_id  # same id: fences the stuck one
    assert made[0].calls == ["init", "begin", "offsets"]  # never called again
    assert made[1].calls == CLOSING
    c.commit(CommitRequest([], [Lease(receiver, "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    assert made[2].calls[-1] == "commit"
    c.close()


@pytest.mark.parametrize("committed", [True, False])
def test_a_hung_commit_is_settled_from_the_groups_offsets(release, committed):
    c, made = committer_with("commit", release)
    # What the group's offsets show once it committed: the position and its metadata, which names
    # the committing process after the completed offsets (core/txn/commit_holder.py).
    found = [
        TopicPartition("q", 0, 7, metadata=with_holder("m", c.holder))
        if committed
        else TopicPartition("q", 0, 3, metadata="")
    ]
    c._settler.group_offsets = lambda group, tps, t: found  # type: ignore[method-assign]
    receiver = FakeReceiver()
    req = CommitRequest([], [Lease(receiver, "g", None, offsets=[(0, 6)])])  # type: ignore[arg-type]
    if committed:
        c.commit(req)  # it did commit: the reader must not get its messages again
        assert receiver.excluded == 0
    else:
        with pytest.raises(TransactionAbortedError):
            c.commit(req)
        assert receiver.excluded == 1
    assert made[1].txn_id == made[0].txn_id and made[1].calls[0] == "init"
    assert made[0].calls[-1] == "commit"  # no abort on a producer whose commit may be running
    c.close()


def test_a_transaction_that_took_leases_never_commits_on_a_producer_made_after_its_check(release):
    """A conversation lease taken over is fenced through the old holder's producers; a producer
    created after the lease check would not be fenced, so a transaction never commits on one:
    retriable TransactionAbortedError, nothing produced. Later transactions commit."""
    c, made = committer_with("offsets", release)
    receiver = FakeReceiver()
    checked_at = c.generation  # what Transaction records when it first takes a lease
    with pytest.raises(TransactionAbortedError):  # the first producer hangs and is replaced
        c.commit(CommitRequest([], [Lease(receiver, "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    assert c.generation > checked_at
    record = ("t", b"k", b"v", None)
    with pytest.raises(TransactionAbortedError, match="conversation leases"):
        c.commit(CommitRequest([record], [], generation=checked_at))
    assert "produce" not in made[-1].calls
    c.commit(CommitRequest([record], [], generation=c.generation))
    assert made[-1].calls[-2:] == ["produce", "commit"]
    c.commit(CommitRequest([record], []))  # no lease taken: no generation to respect
    c.close()


def test_a_producer_whose_transaction_was_aborted_is_not_used_again(release):
    """send_offsets_to_transaction failed with librdkafka's own time-out (a network stall): the
    transaction is aborted, and the next one runs on a new producer under the same
    transactional.id, whose init bumps the epoch. On the old producer the next transaction's
    record reused the idempotence sequence number of an aborted record whose answer was lost, so
    the broker wrote nothing for it and the transaction committed its offsets without it. Fails
    on the code that kept the producer after a clean abort."""

    class TimingOut(FakeProducer):
        def send_offsets_to_transaction(self, *_a: Any) -> None:
            self._call("offsets")
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to commit offsets to transaction"))

    c, made = committer_whose_first_producer_is(TimingOut, release)
    c.start()
    receiver = FakeReceiver()
    with pytest.raises(TransactionAbortedError):
        c.commit(CommitRequest([("t", b"k", b"v", None)], [Lease(receiver, "g", None, offsets=[(0, 6)])]))  # type: ignore[arg-type]
    assert made[0].calls == ["init", "begin", "produce", "offsets", "abort"]
    c.commit(CommitRequest([("t", b"k", b"v", None)], []))
    assert len(made) == 3 and made[2].txn_id == made[0].txn_id, "the aborted transaction's producer was used again"
    # The closing transaction: topic t's two partitions, the offsets, aborted.
    assert made[1].calls == ["init", "list_topics", "begin", "produce", "produce", "offsets", "abort"]
    assert made[2].calls == ["init", "begin", "produce", "commit"] and made[0].calls[-1] == "abort"
    c.close()


def test_an_unexpected_error_fails_its_batch_and_the_committer_goes_on(release):
    """confluent-kafka raised SystemError (not KafkaException) from a fenced producer's flush in a
    rehearsal; it ended the committing thread and the commit waited for ever. Now the batch is in
    doubt at once, the producers are replaced, and the next commit goes through."""

    class Broken(FakeProducer):
        def commit_transaction(self, _t: float) -> None:
            self._call("commit")
            raise SystemError("a result with an exception set")

    c, made = committer_whose_first_producer_is(Broken, release)
    c.start()
    started = time.monotonic()
    with pytest.raises(TransactionInDoubtError):
        c.commit(CommitRequest([("t", b"k", b"v", None)], []))
    assert time.monotonic() - started < 5
    c.commit(CommitRequest([("t", b"k", b"v", None)], []))
    assert len(made) == 2 and made[1].calls[-1] == "commit"
    c.close()
