"""What the benchmarks' plain-Kafka baselines need besides the clients themselves (those come
from `kafka.clients`, with the baselines' own settings as overrides): delivery reports, record
errors, positions and offsets. Kept here so the benchmark code holds no confluent-kafka types."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from kbroker.errors import KBrokerError
from kbroker.kafka import clients
from kbroker.kafka.clients import kafka_error


def sdk_like_producer(bootstrap: str) -> Producer:
    """The settings Broker uses for SEND: idempotent, acks=all, linger 1 ms."""
    return clients.producer(bootstrap, **{"enable.idempotence": True, "acks": "all", "linger.ms": 1})


def fast_producer(bootstrap: str) -> Producer:
    """A producer for writing large backlogs quickly: big batches, a deep local queue."""
    return clients.producer(bootstrap, **{
        "enable.idempotence": True, "acks": "all", "linger.ms": 50, "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576})


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


def end_offsets(consumer: Consumer, topic: str, partitions: list[int], timeout: float) -> dict[int, int]:
    """partition -> high watermark."""
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in partitions}


def committed_offsets(consumer: Consumer, topic: str, partitions: list[int], timeout: float) -> dict[int, int]:
    """partition -> the consumer's group's committed offset (0 when none yet)."""
    committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
    return {tp.partition: max(tp.offset, 0) for tp in committed}


def read_topic_to_end(bootstrap: str, topic: str, timeout: float = 600.0) -> int:
    """A plain consumer loop reading every partition of `topic` from its start to its end;
    returns the records read (the least any reader of the whole topic does)."""
    consumer = clients.consumer(bootstrap, None, **{"enable.partition.eof": True, "fetch.wait.max.ms": 10})
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
