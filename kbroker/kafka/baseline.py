"""What the benchmarks' plain-Kafka baselines need besides the clients themselves (those come
from `kafka.clients`, with the baselines' own settings as overrides): delivery reports, record
errors, positions and offsets, the consume-transform-produce loop, and a share consumer (KIP-932).
Kept here so the benchmark code holds no confluent-kafka types."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kbroker.core.cluster import ClusterLike
from kbroker.errors import KBrokerError
from kbroker.kafka import clients
from kbroker.kafka.clients import kafka_error

if TYPE_CHECKING:
    from confluent_kafka import ShareConsumer

T = TypeVar("T")
BATCH_RECORDS, BATCH_SECONDS = 100, 0.1  # the consume-transform-produce baselines' commits


def sdk_like_producer(cluster: ClusterLike) -> Producer:
    """The settings Broker uses for SEND: idempotent, acks=all, linger 1 ms."""
    return clients.producer(cluster, **{"enable.idempotence": True, "acks": "all", "linger.ms": 1})


def fast_producer(cluster: ClusterLike) -> Producer:
    """A producer for writing large backlogs quickly: big batches, a deep local queue."""
    return clients.producer(
        cluster,
        **{
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        },
    )


class Delivery:
    """One delivery callback for a producer (`on_delivery=`); remembers the first error."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None
        self.delivered = 0

    def __call__(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.error = self.error or err
        else:
            self.delivered += 1

    def check(self, remaining: int = 0) -> None:
        """Raise the first delivery error (typed), or a RuntimeError when `remaining` records
        (what flush() returned) were not acknowledged."""
        if self.error is not None:
            raise kafka_error("delivery failed", self.error)
        if remaining:
            raise RuntimeError(f"{remaining} record(s) not acknowledged in time")


def is_partition_eof(msg: Message) -> bool:
    """Whether a consumed message is the end-of-partition event, not a record or a failure."""
    err = msg.error()
    return err is not None and err.code() == KafkaError._PARTITION_EOF


def failure(msg: Message) -> KBrokerError:
    """A consumed error event as a typed kbroker error (to raise)."""
    return kafka_error(f"consuming {msg.topic()} failed", msg.error() or Exception("no error"))


def consumed_positions(consumer: Consumer) -> list[TopicPartition]:
    """The positions of the consumer's assigned partitions that have one: what a
    consume-transform-produce loop sends to its transaction."""
    return [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]


def transform_batches(
    consumer: Consumer,
    producer: Producer,
    transform: Callable[[Message], T],
    on_commit: Callable[[list[T]], None],
    running: Callable[[], bool],
) -> None:
    """A hand-written consume-transform-produce loop on a subscribed consumer and a transactional
    producer (transactions initialised): `transform(record)` produces the record's output and
    returns what `on_commit` is given, in a list, once the transaction holding it committed: one
    transaction, with send_offsets_to_transaction, every BATCH_RECORDS records or BATCH_SECONDS.
    Runs while `running()`; a transaction still open when it stops is aborted."""
    pending: list[T] = []
    started = 0.0
    producer.begin_transaction()
    while running():
        left = BATCH_SECONDS - (time.monotonic() - started) if pending else BATCH_SECONDS
        for rec in consumer.consume(BATCH_RECORDS - len(pending), max(left, 0.0)):
            if rec.error():
                if is_partition_eof(rec):
                    continue
                raise failure(rec)
            item = transform(rec)
            if not pending:
                started = time.monotonic()
            pending.append(item)
        if pending and (len(pending) >= BATCH_RECORDS or time.monotonic() - started >= BATCH_SECONDS):
            producer.send_offsets_to_transaction(consumed_positions(consumer), consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            on_commit(pending)
            pending = []
            if not running():
                return
            producer.begin_transaction()
    producer.abort_transaction(30)


def end_offsets(consumer: Consumer, topic: str, partitions: list[int], timeout: float) -> dict[int, int]:
    """partition -> high watermark."""
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in partitions}


def committed_offsets(consumer: Consumer, topic: str, partitions: list[int], timeout: float) -> dict[int, int]:
    """partition -> the consumer's group's committed offset (0 when none yet)."""
    committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
    return {tp.partition: max(tp.offset, 0) for tp in committed}


def read_topic_to_end(cluster: ClusterLike, topic: str, timeout: float = 600.0) -> int:
    """A plain consumer loop reading every partition of `topic` from its start to its end;
    returns the records read (the least any reader of the whole topic does)."""
    consumer = clients.consumer(cluster, f"baseline.{topic}", **{"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        todo = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        records, deadline = 0, time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.05):
                if is_partition_eof(msg):
                    todo.discard(msg.partition())
                elif msg.error() is None:
                    records += 1
        if todo:
            raise RuntimeError(f"{topic} not read to its end in {timeout:g} s")
        return records
    finally:
        consumer.close()


def commit_offsets(consumer: Consumer, topic: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` (partition -> next offset to read) of `topic` for the consumer's group,
    synchronously."""
    if offsets:
        consumer.commit(
            offsets=[TopicPartition(topic, p, off) for p, off in sorted(offsets.items())], asynchronous=False
        )


def share_group_reads_from_start(cluster: ClusterLike, group: str, timeout: float = 30.0) -> None:
    """Set the share group's `share.auto.offset.reset` to `earliest` (a group config, set before
    its first member joins): a share group starts at the end of the log by default, so records
    written before it existed, a preloaded queue, would never be delivered."""
    admin = clients.admin(cluster)
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout)
    except KafkaException as exc:
        raise kafka_error(f"could not configure share group {group!r}", exc.args[0]) from None


def share_consumer(cluster: ClusterLike, group: str, topic: str, **overrides: Any) -> ShareConsumer:
    """A share consumer (KIP-932) of `topic` in share group `group`, acknowledging explicitly
    (acknowledge() each record, then commit_sync()); the group reads from the log's start.
    ShareConsumer came with confluent-kafka 2.15: imported here, so that an older one costs only
    its caller (an ImportError)."""
    from confluent_kafka import ShareConsumer

    share_group_reads_from_start(cluster, group)
    consumer = ShareConsumer(
        clients.base(cluster, **{"group.id": group, "share.acknowledgement.mode": "explicit", **overrides})
    )
    consumer.subscribe([topic])
    return consumer
