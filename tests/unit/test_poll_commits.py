"""The direct commit's two halves without a broker: the poll thread's queue of commits
(kafka/receive/poll_commits.py) and the committer's side (kafka/txn/offset_commit.py): order,
a revoked partition never committed, a closed consumer, errors mapped to the transaction's
outcome, and an unanswered commit holding back the next one of its receiver."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker import errors
from kbroker.kafka.receive.poll_commits import PollCommits
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.kafka.txn.offset_commit import OffsetCommits


class Consumer:
    def __init__(self, fail: KafkaError | None = None):
        self.commits: list[list[TopicPartition]] = []
        self.fail = fail

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        assert asynchronous is False
        if self.fail is not None:
            raise KafkaException(self.fail)
        self.commits.append(offsets)
        return offsets


def tps(*offsets: int) -> list[TopicPartition]:
    return [TopicPartition("q", p, o) for p, o in enumerate(offsets)]


def test_the_poll_thread_makes_them_in_order_and_skips_a_revoked_one():
    commits, consumer = PollCommits(), Consumer()
    first = commits.submit(tps(1), lambda: True)
    moved = commits.submit(tps(2), lambda: False)  # its partition was revoked meanwhile
    last = commits.submit(tps(3), lambda: True)
    assert commits.waiting()
    commits.serve(consumer, threading.RLock())
    assert [c[0].offset for c in consumer.commits] == [1, 3] and not commits.waiting()
    assert first.result(0)[0].offset == 1 and last.result(0)[0].offset == 3
    with pytest.raises(KafkaException) as raised:
        moved.result(0)
    assert raised.value.args[0].code() == KafkaError.ILLEGAL_GENERATION  # never sent


def test_a_commit_handed_over_wakes_the_waiting_poll_thread_at_once():
    """The poll thread waits in wait() while a transaction holds messages; a commit handed over
    ends that wait then, not at its end. Before, the thread waited inside consume() for its 2 ms
    and a RECEIVE outside a transaction paid most of them."""
    commits, consumer = PollCommits(), Consumer()
    woke: list[float] = []

    def poll_thread() -> None:
        started = time.monotonic()
        commits.wait(30)
        woke.append(time.monotonic() - started)
        commits.serve(consumer, threading.RLock())

    thread = threading.Thread(target=poll_thread)
    thread.start()
    time.sleep(0.05)
    assert not woke  # nothing handed over: it waits
    done = commits.submit(tps(4), lambda: True)
    assert done.result(5)[0].offset == 4
    thread.join(5)
    assert woke and woke[0] < 5
    # Handed over before the wait: the wait returns at once; served, the next one waits again.
    commits.submit(tps(5), lambda: True)
    started = time.monotonic()
    commits.wait(30)
    assert time.monotonic() - started < 1
    commits.serve(consumer, threading.RLock())
    started = time.monotonic()
    commits.wait(0.05)
    assert time.monotonic() - started >= 0.04
    assert [c[0].offset for c in consumer.commits] == [4, 5]


def test_what_waits_at_close_fails_and_nothing_is_taken_after():
    commits = PollCommits()
    waiting = commits.submit(tps(1), lambda: True)
    commits.close()
    for future in (waiting, commits.submit(tps(2), lambda: True)):
        with pytest.raises(RuntimeError):
            future.result(0)


class Receiver:
    """Hands its commits to a PollCommits that the test serves (or not)."""

    def __init__(self, consumer: Consumer):
        self.commits, self.consumer, self.excluded = PollCommits(), consumer, []

    def commit_offsets(self, offsets: list[TopicPartition], leases: list[Any]) -> concurrent.futures.Future[Any]:
        future = self.commits.submit(offsets, lambda: True)
        if self.consumer is not None:
            self.commits.serve(self.consumer, threading.RLock())
        return future

    def exclude(self, leases: list[Any]) -> None:
        self.excluded.append(leases)


def batch(records: int = 0, generation: int | None = None) -> list[CommitRequest]:
    return [CommitRequest([("t", None, b"x", None)] * records, [], generation)]


def denied(err: KafkaError, offsets: list[TopicPartition]) -> Exception:
    return errors.PermissionDeniedError(err.str())


@pytest.mark.parametrize(
    "code, outcome",
    [
        (KafkaError.ILLEGAL_GENERATION, errors.RebalanceAbortedError),
        (KafkaError.UNKNOWN_MEMBER_ID, errors.RebalanceAbortedError),
        (KafkaError.REQUEST_TIMED_OUT, errors.TransactionInDoubtError),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, errors.PermissionDeniedError),
        (KafkaError.COORDINATOR_NOT_AVAILABLE, errors.TransactionAbortedError),
    ],
)
def test_a_failed_commit_ends_its_transactions_with_the_matching_error(code, outcome):
    receiver, direct = Receiver(Consumer(KafkaError(code))), OffsetCommits(1.0, denied)
    reqs = batch()
    assert direct.took(reqs, {receiver: ["lease"]}, {receiver: tps(5)})
    assert isinstance(reqs[0].error, outcome) and receiver.excluded == [["lease"]] and direct.commits == 0


def test_only_a_batch_that_wrote_nothing_for_one_receiver_is_committed_directly():
    a, b, direct = Receiver(Consumer()), Receiver(Consumer()), OffsetCommits(1.0, denied)
    assert not direct.took(batch(records=1), {a: []}, {a: tps(1)})
    assert not direct.took(batch(generation=3), {a: []}, {a: tps(1)})
    assert not direct.took(batch(), {a: [], b: []}, {a: tps(1), b: tps(1)})
    reqs = batch()
    assert direct.took(reqs, {a: []}, {a: tps(7)}) and reqs[0].error is None and reqs[0].done.is_set()
    assert a.consumer.commits == [tps(7)] and direct.commits == 1


def test_an_unanswered_commit_is_in_doubt_and_holds_back_its_receivers_next_commit():
    stuck, direct = Receiver(None), OffsetCommits(0.05, denied)  # nobody serves its commits
    reqs = batch()
    assert direct.took(reqs, {stuck: ["l"]}, {stuck: tps(1)})
    assert isinstance(reqs[0].error, errors.TransactionInDoubtError)
    held = direct.settled([stuck])  # still unanswered: the next commit may not go out
    assert isinstance(held, errors.TransactionAbortedError)
    stuck.commits.serve(Consumer(), threading.RLock())  # it is answered at last
    assert direct.settled([stuck]) is None and direct.settled([stuck]) is None


def test_nothing_completed_is_committed_at_once_without_a_request():
    """GET CONVERSATION GROUP, or a rollback to a savepoint before every RECEIVE: no offsets (or
    none librdkafka finds to commit, _NO_OFFSET): committed, nothing sent."""
    quiet, direct = Receiver(Consumer()), OffsetCommits(1.0, denied)
    reqs = batch()
    assert direct.took(reqs, {quiet: []}, {quiet: []}) and reqs[0].error is None
    assert quiet.consumer.commits == []
    none_valid = Receiver(Consumer(KafkaError(KafkaError._NO_OFFSET)))
    reqs = batch()
    assert direct.took(reqs, {none_valid: []}, {none_valid: tps(-1001)}) and reqs[0].error is None
    assert direct.commits == 2
