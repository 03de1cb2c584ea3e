"""Reading topics to their end as of now. One primitive, `read_partitions`: given partitions from
given offsets up to where each ends when the read starts. The snapshot views (`read_to_end`), the
catalog (`catalog_store.read_catalog`) and the endpoints cache (`EndpointStore`, which reads on
from the positions it remembers) are all built on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import (
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.errors import BrokerUnavailableError, denied_code
from kbroker.kafka import clients
from kbroker.kafka.clients import consume_soon, is_transient, kafka_error
from kbroker.kafka.clients import consumer as new_consumer

# Seconds a read waits for its next records: consume_soon returns as soon as one (or a
# partition's EOF) is there, so a read that reached the end never waits this out.
CONSUME_WAIT = 0.05


ASK_ONE = 2.0  # seconds for one committed-offsets request (the unstable case is asked per partition)
ASK_ATTEMPT = 1.0  # seconds one request of a partition's leader may take before it is looked up again

T = TypeVar("T")


class Unread(TopicPartition):
    """A partition whose committed offset could not be read (offset -1001), with `error` saying
    why: a Kafka transaction holding its offsets is still open, or the coordinator did not
    answer in time."""

    def __init__(self, topic: str, partition: int, error: KafkaError):
        super().__init__(topic, partition, OFFSET_INVALID)
        self._why = error

    @property
    def error(self) -> KafkaError:  # type: ignore[override]
        return self._why


def offsets_reader(cluster: ClusterLike, group: str, *, stable: bool = True) -> Consumer:
    """A consumer of `group`'s id that never subscribes: it only reads the group's committed
    offsets (`group_offsets`), so it never joins, or disturbs, the group. stable: offsets a
    still-open Kafka transaction holds are not answered (what settling and assigning need);
    the views take them as they stand."""
    return new_consumer(cluster, group, **({} if stable else {"isolation.level": "read_uncommitted"}))


def group_offsets(reader: Consumer, partitions: list[TopicPartition], seconds: float) -> list[TopicPartition]:
    """The committed offsets of `partitions` in the group `reader` was made for (offsets_reader).

    Not through an admin client: librdkafka's ListConsumerGroupOffsets dereferences the missing
    consumer-group handle of an admin client when the coordinator answers NOT_COORDINATOR, as it
    does while a broker restarts, and the whole process dies of a segmentation fault (librdkafka
    issue 5040; seen here as workers dying after a broker restart). Not through the group's own
    consumer either: it may be inside a rebalance, or waiting on a stale coordinator.

    Asked for all partitions at once, then, if that does not answer within ASK_ONE seconds (one
    partition's offsets held by an open transaction hold the whole answer), one partition at a
    time, so one such partition does not keep the others from being told: it comes back as
    `Unread` (offset -1001 and its error; see without_errors). Bounded by `seconds` in all.
    KafkaException when the coordinator refuses, or when no partition answers at all."""
    tps = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    deadline = time.monotonic() + seconds
    try:
        return list(reader.committed(tps, timeout=max(0.1, min(ASK_ONE, seconds))))
    except KafkaException as exc:
        first = exc.args[0]
        if first.code() != KafkaError._TIMED_OUT or len(tps) == 1:
            raise  # the coordinator said no, or there is nothing to tell apart: the caller retries
    out: list[TopicPartition] = []
    for tp in tps:
        left = deadline - time.monotonic()
        if left <= 0:
            out.append(Unread(tp.topic, tp.partition, first))
            continue
        try:
            out += reader.committed([tp], timeout=max(0.1, min(ASK_ONE, left)))
        except KafkaException as exc:
            out.append(Unread(tp.topic, tp.partition, exc.args[0]))
    if all(isinstance(tp, Unread) for tp in out):
        raise KafkaException(first)  # not one partition's transaction: nothing answers
    return out


def committed_offsets(
    cluster: ClusterLike, group: str, partitions: list[TopicPartition], seconds: float, *, stable: bool = True
) -> list[TopicPartition]:
    """group_offsets, once, with a reader of its own (closed after): for callers that ask now
    and then (the views, the 5th-tick reclaim). A Kafka failure raises a typed kbroker error."""
    reader = offsets_reader(cluster, group, stable=stable)
    try:
        return group_offsets(reader, partitions, seconds)
    except KafkaException as exc:
        topics = " or ".join(sorted({tp.topic for tp in partitions}))
        raise clients.denied(
            cluster,
            exc.args[0],
            f"cannot list the committed offsets of {group}",
            group=("DESCRIBE", group),
            topic=("DESCRIBE", topics),
        ) from None
    finally:
        reader.close()


def check_read(cluster: ClusterLike, group: str, topic: str, seconds: float = 10.0) -> None:
    """PermissionDeniedError unless the principal may read `topic` (its first partition, from
    its end: nothing is read) with `group`'s id: a check before handing the topic to a client
    that shows a refusal no better than a topic with nothing new (Spark's pattern source). True
    once the fetch reached the end; a deadline passed without an answer is not a refusal."""
    consumer = reading_consumer(cluster, group)
    deadline = time.monotonic() + seconds
    try:
        if topic_partitions(consumer, topic, seconds) is None:
            return
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        while time.monotonic() < deadline:
            for msg in consumer.consume(10, CONSUME_WAIT):
                err = msg.error()
                if err is not None and denied_code(err):
                    raise clients.denied(
                        cluster, err, f"reading {topic} failed", topic=("READ", topic), group=("DESCRIBE", group)
                    )
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    return
    finally:
        consumer.close()


def check_group(cluster: ClusterLike, group: str, topic: str, seconds: float = 10.0) -> None:
    """PermissionDeniedError unless the principal may look `group` up and read its committed
    offsets of `topic`'s first partition: a check before handing the group to a client that
    would wait for ever on a refusal (the worker's Faust consumer). librdkafka reports the
    refusal of the group's coordinator as an error event, while committed() waits it out."""
    reader = offsets_reader(cluster, group)
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                reader.committed([TopicPartition(topic, 0)], timeout=1.0)
                return
            except KafkaException as exc:
                err = exc.args[0]
            event = reader.poll(0.1)
            if event is not None and event.error() is not None and denied_code(event.error()):
                err = event.error()
            if denied_code(err) or time.monotonic() >= deadline:
                raise clients.denied(
                    cluster,
                    err,
                    f"cannot read the committed offsets of group {group}",
                    group=("READ", group),
                    topic=("DESCRIBE", topic),
                )
    finally:
        reader.close()


def without_errors(positions: list[TopicPartition]) -> list[TopicPartition]:
    """Committed offsets as read, or KafkaException for the first partition that came with an
    error of its own (UNSTABLE_OFFSET_COMMIT): its offset, -1001, read as an offset would settle
    an in-doubt commit wrongly."""
    for tp in positions:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return list(positions)


def reading_consumer(cluster: ClusterLike, group_id: str, **overrides: object) -> Consumer:
    """A consumer for `read_partitions`: it reports partition EOF (the end of a read), and does
    not long-poll at the end (a catch-up read should return as soon as it is there)."""
    return new_consumer(cluster, group_id, **{"enable.partition.eof": True, "fetch.wait.max.ms": 10, **overrides})


@dataclass
class PartitionsRead:
    """What `read_partitions` read: the records (in offset order within each partition), the
    next offset to read of every partition asked for, and the partitions whose end was not
    reached before the deadline."""

    records: list[Message] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    unfinished: set[int] = field(default_factory=set)


def topic_partitions(
    client: Consumer | Producer, topic: str, timeout: float, *, never_creates: bool = False
) -> list[int] | None:
    """The topic's partition numbers; None when it does not exist. PermissionDeniedError when
    the client may not see it (a topic the principal may not DESCRIBE). `never_creates`: the
    producer was built with allow.auto.create.topics false (a consumer always is)."""
    try:
        if never_creates or isinstance(client, Consumer):
            # By name: the metadata request does not ask for the topic to be created, and the
            # broker's answer costs it one topic, where an answer about all topics costs every
            # topic of the cluster (and leaves out, as if absent, those this principal may not
            # DESCRIBE).
            meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
        else:
            # A producer's request naming the topic could auto-create it: ask for all topics.
            meta = client.list_topics(timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise kafka_error("cannot read topic metadata", exc.args[0]) from None
    if meta is not None and meta.error is not None and denied_code(meta.error):
        raise kafka_error(f"cannot see topic {topic}", meta.error, on={"topic": ("DESCRIBE", topic)})
    if meta is None or meta.error is not None:
        return None
    return sorted(meta.partitions)


def watermarks(consumer: Consumer, topic: str, partition: int, deadline: float) -> tuple[int, int]:
    """(log start, high watermark) of a partition, asked of its leader."""
    tp = TopicPartition(topic, partition)
    return of_leader(
        consumer,
        topic,
        deadline,
        lambda timeout: consumer.get_watermark_offsets(tp, timeout=timeout),
        f"cannot read the end offsets of {topic}",
    )


def offset_at(consumer: Consumer, topic: str, partition: int, when_ms: int, deadline: float) -> int:
    """The first offset of a partition whose record is stamped `when_ms` or later (negative when
    there is none), asked of its leader."""

    def ask(timeout: float) -> int:
        [found] = consumer.offsets_for_times([TopicPartition(topic, partition, when_ms)], timeout)
        if found.error is not None:  # the partition's own answer: asked again as a failed call
            raise KafkaException(found.error)
        return int(found.offset)

    return of_leader(consumer, topic, deadline, ask, f"cannot find the records of {topic} since {when_ms}")


def of_leader(client: Consumer, topic: str, deadline: float, ask: Callable[[float], T], what: str) -> T:
    """ask(timeout)'s answer, a question for the leader of one of `topic`'s partitions.

    A topic created a moment ago may have no leader yet ("not leader for partition", which
    librdkafka does not flag retriable here): asked again until the deadline, as any error but a
    fatal one, then reported as a typed error saying `what`. A client that does not fetch the
    partition keeps asking the leader it learnt first: once that node is gone every request
    times out, for the 5 minutes until librdkafka's next metadata refresh. So an attempt is
    bounded and a failed one looks the topic up again (answered 9 s after a leader's SIGKILL,
    6 s of them its session time-out)."""

    def attempt() -> T:
        try:
            return ask(_attempt(deadline))
        except KafkaException as exc:
            if not exc.args[0].fatal():
                look_up(client, topic, deadline)
            raise

    return clients.asked_until(deadline, attempt, lambda err: not err.fatal(), what, on={"topic": ("DESCRIBE", topic)})


def look_up(client: Consumer, topic: str, deadline: float) -> None:
    """Ask for `topic`'s metadata now, which moves the client's requests to its partitions'
    current leaders; a failure is left to the request that follows."""
    try:
        client.list_topics(topic, timeout=_attempt(deadline))
    except KafkaException:
        pass


def _attempt(deadline: float) -> float:
    return max(0.1, min(ASK_ATTEMPT, deadline - time.monotonic()))


def read_partitions(
    consumer: Consumer,
    topic: str,
    starts: Mapping[int, int],
    timeout: float,
    on_record: Callable[[Message], None] | None = None,
) -> PartitionsRead:
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
            for msg in consume_soon(consumer, 500, CONSUME_WAIT):
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
                    raise kafka_error(f"reading {topic} failed", err, on=_reading(topic))
    finally:
        consumer.unassign()
    read.unfinished = todo
    return read


def _reading(topic: str) -> dict[str, tuple[str, str]]:
    """What a refusal while reading `topic` refused: READ on the topic, or looking up the
    coordinator of its namespace's readers' group (the group every reading_consumer is given)."""
    group = names.reader_group_of(topic)
    return {"topic": ("READ", topic), **({"group": ("DESCRIBE", group)} if group else {})}


def read_to_end(
    cluster: ClusterLike, topic: str, timeout: float = 10.0, *, must_finish: bool = False
) -> list[Message] | None:
    """Every committed record of `topic`, in offset order within each partition; None when the
    topic does not exist. What was read by `timeout` is returned, unless `must_finish`: then
    not reaching the end raises BrokerUnavailableError."""
    group = names.reader_group_of(topic)
    if group is None:
        raise ValueError(f"{topic} is not a topic of a kbroker namespace")
    consumer = reading_consumer(cluster, group)
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


def latest_values(
    cluster: ClusterLike, topic: str, timeout: float = 10.0, *, must_finish: bool = False
) -> dict[bytes, bytes] | None:
    """A compacted topic as key -> last value, tombstoned keys left out; None when it does not
    exist. `must_finish`: as read_to_end's (a partial read raises instead)."""
    latest = latest_records(cluster, topic, timeout, must_finish=must_finish)
    return None if latest is None else {key: m.value() or b"" for key, m in latest.items()}


def latest_records(
    cluster: ClusterLike, topic: str, timeout: float = 10.0, *, must_finish: bool = False
) -> dict[bytes, Message] | None:
    """latest_values, with each key's last record itself (where it is: for a reader that sets
    a bad one aside)."""
    records = read_to_end(cluster, topic, timeout, must_finish=must_finish)
    if records is None:
        return None
    latest: dict[bytes, Message] = {}
    for m in records:
        key = m.key()
        if key is None:
            continue
        if m.value() is None:
            latest.pop(key, None)
        else:
            latest[key] = m
    return latest
