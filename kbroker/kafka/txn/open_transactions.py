"""The Kafka transactions open now on a namespace's topics, for `kbroker diagnose runtime`.

A partition's last stable offset (what a read_committed reader may read up to) stops at the
first record of the oldest transaction still open on it, while its high watermark goes on: so
a partition whose two ends differ has an open transaction, and the timestamp of the record at
the last stable offset says when it began. Kafka's admin API of confluent-kafka has no
ListTransactions or DescribeProducers, and needs none for this: two ListOffsets and one fetch.
"""

from __future__ import annotations

import time

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.runtime_diagnosis import OpenTransaction
from kbroker.kafka import clients
from kbroker.kafka.clients import consume_soon, is_transient, kafka_error
from kbroker.kafka.snapshot import reading_consumer


def open_transactions(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> list[OpenTransaction]:
    """Every partition of `namespace`'s topics with a transaction open on it, with when its first
    record was written (None when that record could not be read within `timeout`)."""
    admin = clients.admin(cluster)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    tps = [
        TopicPartition(topic, p)
        for topic, meta in sorted(metadata.topics.items())
        if meta.error is None and names.namespace_of(topic) == namespace
        for p in sorted(meta.partitions)
    ]
    if not tps:
        return []
    stable = _ends(admin, tps, IsolationLevel.READ_COMMITTED, timeout)
    high = _ends(admin, tps, IsolationLevel.READ_UNCOMMITTED, timeout)
    behind = {
        (tp.topic, tp.partition): (stable[tp.topic, tp.partition], high[tp.topic, tp.partition])
        for tp in tps
        if stable[tp.topic, tp.partition] < high[tp.topic, tp.partition]
    }
    began = _first_timestamps(cluster, namespace, {k: start for k, (start, _) in behind.items()}, timeout)
    return [
        OpenTransaction(topic, p, start, end, began.get((topic, p)))
        for (topic, p), (start, end) in sorted(behind.items())
    ]


def _ends(
    admin: AdminClient, tps: list[TopicPartition], isolation: IsolationLevel, timeout: float
) -> dict[tuple[str, int], int]:
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest() for tp in tps}, isolation_level=isolation, request_timeout=timeout
    )
    return {
        (tp.topic, tp.partition): clients.result_of(f, f"cannot list the offsets of {tp.topic}").offset
        for tp, f in futures.items()
    }


def _first_timestamps(
    cluster: ClusterLike, namespace: str, starts: dict[tuple[str, int], int], timeout: float
) -> dict[tuple[str, int], float]:
    """(topic, partition) -> epoch s of the record at its start offset (read uncommitted)."""
    if not starts:
        return {}
    consumer = reading_consumer(cluster, names.reader_group(namespace), **{"isolation.level": "read_uncommitted"})
    found: dict[tuple[str, int], float] = {}
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
        while len(found) < len(starts) and time.monotonic() < deadline:
            for msg in consume_soon(consumer, 500, 0.5):
                err, key = msg.error(), (msg.topic(), msg.partition())
                if err is None and key in starts and key not in found:
                    at = msg.timestamp()[1]
                    if at > 0:  # else no timestamp: when it began stays unknown
                        found[key] = at / 1000
                elif err is not None and err.code() != KafkaError._PARTITION_EOF and not is_transient(err):
                    raise kafka_error(f"reading {msg.topic()} failed", err)
    finally:
        consumer.close()
    return found
