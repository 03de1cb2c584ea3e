"""Reading topics to their end as of now. One primitive, `read_partitions`: given partitions from
given offsets up to where each ends when the read starts. The snapshot views (`read_to_end`), the
catalog (`catalog_store.read_catalog`) and the endpoints cache (`EndpointStore`, which reads on
from the positions it remembers) are all built on it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from confluent_kafka.admin import AdminClient

from kbroker.errors import BrokerUnavailableError
from kbroker.kafka.clients import consumer as new_consumer
from kbroker.kafka.clients import is_transient, kafka_error

CONSUME_WAIT = 0.05  # seconds per consume(): it waits its whole timeout unless the batch fills


def group_offsets(admin: AdminClient, group: str, partitions: list[TopicPartition],
                  seconds: float) -> list[TopicPartition]:
    """A consumer group's stable committed offsets of `partitions`, asked with an admin client:
    the group's own consumer may be inside a rebalance, or just reconnected after a broker
    restart, and not answer. A partition whose offsets are not stable (a transaction holding
    some is still open) comes back with its own error and offset -1001: see without_errors."""
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(tp.topic, tp.partition) for tp in partitions])]
    future = admin.list_consumer_group_offsets(request, require_stable=True, request_timeout=seconds)[group]
    # Waited a second past the request's own timeout, so librdkafka's error (more telling) wins.
    return list(future.result(timeout=seconds + 1.0).topic_partitions or [])


def without_errors(positions: list[TopicPartition]) -> list[TopicPartition]:
    """Committed offsets as read, or KafkaException for the first partition that came with an
    error of its own (UNSTABLE_OFFSET_COMMIT): its offset, -1001, read as an offset would settle
    an in-doubt commit wrongly."""
    for tp in positions:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return list(positions)


def reading_consumer(bootstrap: str, group_id: str | None = None, **overrides: object) -> Consumer:
    """A consumer for `read_partitions`: it reports partition EOF (the end of a read), and does
    not long-poll at the end (a catch-up read should return as soon as it is there)."""
    return new_consumer(bootstrap, group_id, **{"enable.partition.eof": True, "fetch.wait.max.ms": 10,
                                                **overrides})


@dataclass
class PartitionsRead:
    """What `read_partitions` read: the records (in offset order within each partition), the
    next offset to read of every partition asked for, and the partitions whose end was not
    reached before the deadline."""

    records: list[Message] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    unfinished: set[int] = field(default_factory=set)


def topic_partitions(client: Consumer | Producer, topic: str, timeout: float) -> list[int] | None:
    """The topic's partition numbers; None when it does not exist."""
    # Ask for all topics: a metadata request naming the topic could auto-create it.
    try:
        meta = client.list_topics(timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise kafka_error("cannot read topic metadata", exc.args[0]) from None
    if meta is None or meta.error is not None:
        return None
    return sorted(meta.partitions)


def watermarks(consumer: Consumer, topic: str, partition: int, deadline: float) -> tuple[int, int]:
    """(log start, high watermark) of a partition, asked of its leader."""
    # A topic created a moment ago may have no leader yet ("not leader for partition", which
    # librdkafka does not flag retriable here): retry until the deadline, then report the error.
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=max(0.1, deadline - time.monotonic()))
            return low, high
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or time.monotonic() > deadline:
                raise kafka_error(f"cannot read the end offsets of {topic}", err) from None
            time.sleep(0.1)


def read_partitions(consumer: Consumer, topic: str, starts: Mapping[int, int], timeout: float,
                    on_record: Callable[[Message], None] | None = None) -> PartitionsRead:
    """Read `topic`'s partitions from `starts` (partition -> first offset to read; an offset
    below the log start reads from the log start) up to their end as of now, within `timeout`.
    With `on_record`, each record is handed to it as it arrives and not kept: memory stays one
    batch whatever the topic holds.

    The end is partition EOF, not "offset == high watermark": transaction markers take offsets
    too, and a read-committed reader's end is the last stable offset. So `consumer` must report
    EOF (see `reading_consumer`); it is assigned the partitions for the read and unassigned
    after. Errors librdkafka recovers from (a lost connection) are waited out until the deadline;
    any other raises a typed error (BrokerUnavailableError when trying later may help)."""
    deadline = time.monotonic() + timeout
    read = PartitionsRead(positions=dict(starts))
    first: dict[int, int] = {}
    for p, start in starts.items():
        low, high = watermarks(consumer, topic, p, deadline)
        if high > max(start, low):
            first[p] = max(start, low)
    if not first:
        return read
    todo = set(first)
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in first.items()])
    try:
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(500, CONSUME_WAIT):
                err, partition, offset = msg.error(), msg.partition(), msg.offset()
                if err is None and partition is not None and offset is not None:
                    read.positions[partition] = offset + 1
                    if on_record is None:
                        read.records.append(msg)
                    else:
                        on_record(msg)
                elif err is None:
                    continue
                elif err.code() == KafkaError._PARTITION_EOF:
                    if partition in todo and offset is not None:  # EOF's offset is the end: the next to read
                        read.positions[partition] = max(read.positions[partition], offset)
                        todo.discard(partition)
                elif not is_transient(err):
                    raise kafka_error(f"reading {topic} failed", err)
    finally:
        consumer.unassign()
    read.unfinished = todo
    return read


def read_to_end(bootstrap: str, topic: str, timeout: float = 10.0, *,
                must_finish: bool = False) -> list[Message] | None:
    """Every committed record of `topic`, in offset order within each partition; None when the
    topic does not exist. What was read by `timeout` is returned, unless `must_finish`: then
    not reaching the end raises BrokerUnavailableError."""
    consumer = reading_consumer(bootstrap, f"kbroker-view-{uuid.uuid4().hex[:8]}")
    try:
        partitions = topic_partitions(consumer, topic, timeout)
        if partitions is None:
            return None
        read = read_partitions(consumer, topic, dict.fromkeys(partitions, 0), timeout)
    finally:
        consumer.close()
    if read.unfinished and must_finish:
        raise BrokerUnavailableError(f"could not read {topic} to its end in {timeout} s")
    return read.records


def latest_values(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[bytes, bytes] | None:
    """A compacted topic as key -> last value, tombstoned keys left out; None when it does not exist."""
    records = read_to_end(bootstrap, topic, timeout)
    if records is None:
        return None
    latest: dict[bytes, bytes] = {}
    for m in records:
        key, value = m.key(), m.value()
        if key is None:
            continue
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = value
    return latest
