"""The holds topic's clients for one process (kafka/dialogs/group_holds.py decides what to write):
a consumer that follows its one partition from READ_BACK seconds ago, a producer, and the
questions statements ask of them: has every record written before now been read, and how many
partitions a queue topic has.

The follower's thread alone uses its consumer: a watermark asked from another thread beside its
consume() was seen to wait minutes. catch_up() asks a second consumer, which never consumes, for
the topic's end from the caller's thread. It used to ask the follower, which answered between
two of its 20 ms polls: a SEND on a group this process did not hold waited 21 ms (p50) for that.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Message, Producer, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.dialogs.group_hold import READ_BACK, HoldRecord, MalformedHoldRecord
from kbroker.errors import KBrokerError
from kbroker.kafka.clients import consume_soon, idempotent_producer
from kbroker.kafka.snapshot import offset_at, reading_consumer, topic_partitions, watermarks
from kbroker.kafka.topics import create_missing_topics

POLL = 0.02  # seconds the follower waits for a record
ASK_SECONDS = 5.0  # the most catch_up() waits for the topic's end
TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(3600 * 1000), "segment.ms": str(600 * 1000)}


def partition_of(group: str, partitions: int) -> int:
    """The partition of the queue topic a group's messages go to: librdkafka's default
    partitioner (consistent_random: CRC-32 of the key), which every kbroker producer uses."""
    return (zlib.crc32(group.encode()) & 0xFFFFFFFF) % partitions


class HoldTopic:
    """`cv` is the holds' condition: it guards the position too, and is notified as it moves."""

    def __init__(self, cluster: Cluster, namespace: str, cv: threading.Condition):
        self._cluster, self._namespace, self._cv = cluster, namespace, cv
        self.topic = names.holds_topic(namespace)
        self.position = -1  # the next offset the follower folds (guarded by cv)
        self._consumer: Consumer | None = None
        self._ends: Consumer | None = None  # asked for the topic's end only (catch_up)
        self._asking = 0  # threads inside a call on _ends (guarded by cv): close() waits for them
        self._producer: Producer | None = None
        self._partition_counts: dict[str, int] = {}
        self.open = False

    def start(self, timeout: float) -> None:
        """Create the topic where an older namespace lacks it; read from READ_BACK s ago.
        BrokerUnavailableError (or another typed error) when Kafka does not answer in `timeout`."""
        create_missing_topics(self._cluster, {self.topic: 1}, TOPIC_CONFIG)
        deadline = time.monotonic() + timeout
        consumer = reading_consumer(self._cluster, names.reader_group(self._namespace), **{"fetch.wait.max.ms": 20})
        ends = reading_consumer(self._cluster, names.reader_group(self._namespace))
        try:
            since = offset_at(consumer, self.topic, 0, int((time.time() - READ_BACK) * 1000), deadline)
            first = since if since >= 0 else OFFSET_END
            consumer.assign([TopicPartition(self.topic, 0, first)])
            low, high = watermarks(consumer, self.topic, 0, deadline)
            producer = idempotent_producer(self._cluster)
        except BaseException:
            consumer.close()
            ends.close()
            raise
        self._consumer, self._ends, self._producer = consumer, ends, producer
        with self._cv:
            self.position = high if first == OFFSET_END else max(first, low)
            self.open = True

    def read(self) -> list[tuple[int, HoldRecord | None]]:
        """On the follower's thread: the next records with their offsets (None for a record that
        is not a hold record); ConnectionError for a Kafka error."""
        consumer = self._consumer
        assert consumer is not None
        out: list[tuple[int, HoldRecord | None]] = []
        # Back as soon as a record is there: consume(500, POLL) waits out POLL unless 500 come,
        # and a statement taking a hold waited that long (19 ms p50) to read its own record.
        for msg in consume_soon(consumer, 500, POLL):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ConnectionError(f"cannot read {self.topic}: {err}")
                continue
            out.append((msg.offset() or 0, _decoded(msg)))
        return out

    def moved(self, offset: int) -> None:
        """Records up to `offset` are folded (under cv)."""
        self.position = max(self.position, offset + 1)

    def write(self, records: list[HoldRecord], timeout: float = 10.0) -> int:
        """Produce `records` and wait for them: the offset of the last (-1 for none).
        ConnectionError when Kafka did not take them."""
        if not records:
            return -1
        producer = self._producer
        assert producer is not None
        last = [-1]
        errors: list[Any] = []

        def delivered(err: Any, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                last[0] = max(last[0], msg.offset() or 0)

        for rec in records:
            producer.produce(
                self.topic, rec.to_json(), key=(rec.group or "").encode(), partition=0, on_delivery=delivered
            )
        producer.flush(timeout)
        if errors or last[0] < 0:
            raise ConnectionError(f"cannot write to {self.topic}: {errors[0] if errors else 'not acknowledged'}")
        return last[0]

    def folded_past(self, offset: int, deadline: float) -> bool:
        with self._cv:
            while self.position <= offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
            return True

    def catch_up(self, deadline: float) -> bool:
        """Wait until the follower folded every record written before this call (False when the
        topic's end cannot be learnt, or is not reached, by `deadline`)."""
        with self._cv:
            ends = self._ends
            if ends is None or not self.open:
                return False
            self._asking += 1
        try:
            _low, end = watermarks(ends, self.topic, 0, min(deadline, time.monotonic() + ASK_SECONDS))
        except KBrokerError:
            return False
        finally:
            with self._cv:
                self._asking -= 1
                if not self.open:  # only close() waits on it: no wake-up for the statements
                    self._cv.notify_all()
        return self.folded_past(end - 1, deadline)

    def partition_for(self, topic: str, group: str, timeout: float) -> int:
        """The partition of `topic` (a queue's) that `group`'s messages go to."""
        n = self._partition_counts.get(topic)
        if n is None:
            producer = self._producer
            assert producer is not None
            found = topic_partitions(producer, topic, timeout)
            n = len(found) if found else 1
            self._partition_counts[topic] = n
        return partition_of(group, n)

    def close(self) -> None:
        """Close the clients. librdkafka frees a consumer's handle at close, under any thread
        still inside a call on it: _ends is closed once no statement (nor a poll thread's
        owned()) asks it, and left to the collector where one still does after ASK_SECONDS."""
        with self._cv:
            self.open = False
            deadline = time.monotonic() + ASK_SECONDS + 1.0
            while self._asking and time.monotonic() < deadline:
                self._cv.wait(0.1)
            ends, self._ends = self._ends, None
            if self._asking:
                ends = None  # still asked: the collector frees it once the last call returns
        for consumer in (self._consumer, ends):
            if consumer is not None:
                consumer.close()
        if self._producer is not None:
            self._producer.flush(5)


def _decoded(msg: Message) -> HoldRecord | None:
    try:
        rec = HoldRecord.from_json(msg.value() or b"")
    except MalformedHoldRecord:
        return None  # another client's record: it holds nothing
    return rec
