"""QueueReceiver's back-pressure, end to end over a fake consumer (no broker): the consumer pauses
once `max_buffered` records wait and resumes at half; and the rule that keeps commit metadata
under Kafka's 4 KiB limit: once a partition's completed-above-the-low-water list nears it, only
the low-water record is handed out. The receiver is built by its constructor and driven through
its public methods, as the SDK drives it."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from confluent_kafka import KafkaError, TopicPartition

from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.receive.offsets import PartitionOffsets
from kbroker.kafka.receive.receiver import QueueReceiver

TOPIC = "kbroker.test.q.Q"
ENQUEUED_MS = 10**12


class FakeRecord:
    """A consumed record (or, with `eof`, the end-of-partition event) as confluent-kafka gives it."""

    def __init__(self, offset: int, envelope: Envelope | None, eof: bool = False) -> None:
        self._offset, self._envelope, self._eof = offset, envelope, eof

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        assert self._envelope is not None
        return self._envelope.headers()

    def key(self) -> bytes | None:
        return self._envelope.conversation_group_id.encode() if self._envelope else None

    def value(self) -> bytes:
        return b"body %d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, ENQUEUED_MS + self._offset)


class FakeConsumer:
    """One partition fed from a list, `batch` records per consume(); nothing while paused, and
    an end-of-partition event once the list is drained (a real consumer's enable.partition.eof)."""

    def __init__(self, conf: dict[str, Any], feed: list[FakeRecord], batch: int, committed: tuple[int, str]) -> None:
        self.conf, self._feed, self._batch, self._committed = conf, list(feed), batch, committed
        self._lock = threading.Lock()
        self._assigned: list[TopicPartition] = []
        self._on_assign: Callable[..., None] | None = None
        self.paused = False
        self.pauses = self.resumes = 0
        self.closed = False

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None],
        on_revoke: Callable[..., None],
        on_lost: Callable[..., None],
    ) -> None:
        assert topics == [TOPIC]
        self._on_assign = on_assign

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        offset, metadata = self._committed
        return [TopicPartition(tp.topic, tp.partition, offset, metadata=metadata) for tp in partitions]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._assigned = list(partitions)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self.paused, self.pauses = True, self.pauses + 1

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self.paused, self.resumes = False, self.resumes + 1

    def consume(self, num_messages: int, timeout: float) -> list[FakeRecord]:
        if self._on_assign is not None and not self._assigned:  # the first poll joins the group
            self._on_assign(self, [TopicPartition(TOPIC, 0)])
        with self._lock:
            if self.paused or not self._feed:
                records: list[FakeRecord] = []
            else:
                records, self._feed = self._feed[: self._batch], self._feed[self._batch :]
                if not self._feed:
                    records.append(FakeRecord(records[-1].offset() + 1, None, eof=True))
        if not records:
            time.sleep(min(timeout, 0.01))
        return records

    def close(self) -> None:
        self.closed = True


def record(offset: int, group: str, priority: int = 5) -> FakeRecord:
    env = Envelope(f"m{offset}", group, group, offset, "T", "C", "F", "S", "TARGET", priority=priority)
    return FakeRecord(offset, env)


def receiver_over(
    feed: list[FakeRecord], *, max_buffered: int = 20_000, batch: int = 500, committed: tuple[int, str] = (0, "")
) -> tuple[QueueReceiver, list[FakeConsumer]]:
    """A started QueueReceiver reading `feed` through a FakeConsumer (returned once start() made it)."""
    made: list[FakeConsumer] = []

    def new_consumer(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf, feed, batch, committed))
        return made[-1]

    dead_letters: list[str] = []
    receiver = QueueReceiver(
        "bootstrap:9092",
        "test",
        "Q",
        topic=TOPIC,
        max_buffered=max_buffered,
        dead_letter=lambda r, rec, why: dead_letters.append(why),
        new_consumer=new_consumer,
    )  # type: ignore[arg-type]
    assert made == [], "the constructor must not create the consumer"
    return receiver.start(), made


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_the_constructor_does_no_io_and_close_without_start_is_fine():
    def no_consumer(conf: dict[str, Any]) -> FakeConsumer:
        raise AssertionError("the constructor or close() made a consumer")

    receiver = QueueReceiver("nowhere:1", "test", "Q", dead_letter=lambda r, rec, why: None, new_consumer=no_consumer)  # type: ignore[arg-type]
    assert receiver.stats()["buffered"] == 0
    receiver.close()


def test_pauses_at_max_buffered_and_resumes_at_half():
    feed = [record(off, f"g{off}") for off in range(40)]
    receiver, made = receiver_over(feed, max_buffered=10, batch=4)
    try:
        consumer = made[0]
        assert consumer.conf["group.id"] == TOPIC and consumer.conf["enable.auto.commit"] is False
        wait_for(lambda: receiver.stats()["paused"], "the pause")
        time.sleep(0.05)  # paused: no more records arrive
        stats = receiver.stats()
        assert consumer.paused and consumer.pauses == 1
        assert 10 <= stats["buffered"] < 14, stats  # stopped within one batch of the bound
        owner = object()
        received: list[int] = []
        while receiver.stats()["buffered"] > 6:  # still above half: stays paused
            lease, msgs = receiver.receive(owner, 1, 1.0)
            assert lease is not None and len(msgs) == 1
            received.append(msgs[0].offset)
            receiver.release(lease, committed=True)
        time.sleep(0.05)
        assert consumer.paused and consumer.resumes == 0
        while len(received) < len(feed):
            lease, msgs = receiver.receive(owner, 1, 5.0)
            assert lease is not None and len(msgs) == 1
            received.append(msgs[0].offset)
            receiver.release(lease, committed=True)
        assert consumer.resumes >= 1
        assert sorted(received) == list(range(40)) and received == sorted(received)  # oldest first
        assert receiver.receive(owner, 1, 0.05) == (None, [])
        assert receiver.stats()["buffered"] == 0
    finally:
        receiver.close()
    assert made[0].closed


def full_commit_metadata(rng: random.Random) -> tuple[int, str, int]:
    """Commit metadata of a partition whose offset 0 a slow reader holds while later records
    completed until the metadata nears Kafka's limit: (position, metadata, next free offset)."""
    tracker = PartitionOffsets(committed=0)
    tracker.fetched(0)
    off = 0
    while tracker.metadata_room():
        off += rng.randint(1, 5000)
        tracker.fetched(off)
        tracker.complete(off)
    position, metadata = tracker.commit_position()
    return position, metadata, off + 1


def test_full_metadata_hands_out_only_the_low_water_record():
    position, metadata, newer = full_commit_metadata(random.Random(3))
    assert position == 0
    # The next owner of the partition re-reads offset 0 (still incomplete) and the newer records.
    feed = [record(0, "low"), record(newer, "newer", priority=10), record(newer + 1, "low")]
    receiver, _ = receiver_over(feed, committed=(position, metadata))
    try:
        wait_for(lambda: receiver.stats()["buffered"] == 3, "the records")
        owner = object()
        # "newer" outranks "low" by priority but sits above the low-water mark: refused.
        lease, msgs = receiver.receive(owner, 10, 1.0)
        assert lease is not None and lease.group == "low"
        assert [m.offset for m in msgs] == [0], "only the low-water record while the metadata is full"
        assert receiver.receive(object(), 10, 0.05) == (None, [])  # nothing else may go out
        # Once the low-water record commits, the committed offset moves and the rest flows.
        positions = receiver.include([lease])
        assert positions is not None and [(tp.partition, tp.offset) for tp in positions] == [(0, newer)]
        receiver.release(lease, committed=True)
        lease, msgs = receiver.receive(owner, 10, 1.0)
        assert lease is not None and lease.group == "newer" and [m.offset for m in msgs] == [newer]
    finally:
        receiver.close()


def test_room_left_picks_by_priority_then_age():
    feed = [record(0, "b"), record(1, "a"), record(2, "a"), record(3, "c", priority=7)]
    receiver, _ = receiver_over(feed)
    try:
        wait_for(lambda: receiver.stats()["buffered"] == 4, "the records")
        order = []
        for _ in range(3):
            lease, msgs = receiver.receive(object(), 10, 1.0)
            assert lease is not None
            order.append((lease.group, [m.offset for m in msgs]))
        assert order == [("c", [3]), ("b", [0]), ("a", [1, 2])]
    finally:
        receiver.close()
