"""Creating and deleting topics outside the catalog: the worker's own topics, and the benchmark's
clean-up. (The catalog's topics are `kafka.apply`'s: it also reconfigures and grows them.)"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from kbroker.core.cluster import ClusterLike
from kbroker.kafka import clients
from kbroker.kafka.clients import kafka_error


def create_missing_topics(
    cluster: ClusterLike,
    partitions: dict[str, int],
    config: dict[str, str],
    *,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> list[str]:
    """Create those of the topics (name -> partition count) that do not exist, with `config`;
    returns the names created. A topic another process creates meanwhile is not an error."""
    admin = clients.admin(cluster)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    new = [
        NewTopic(topic, n, replication_factor, config=dict(config))
        for topic, n in partitions.items()
        if topic not in existing
    ]
    if not new:
        return []
    created = []
    for topic, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result()
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise clients.denied(
                    cluster, exc.args[0], f"cannot create topic {topic}", topic=("CREATE", topic)
                ) from None
    return created


def partition_counts(cluster: ClusterLike, topics: Iterable[str], timeout: float = 10.0) -> dict[str, int]:
    """The partition count of each of the topics that exists; those that do not are left out."""
    try:
        meta = clients.admin(cluster).list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    return {t: len(meta[t].partitions) for t in topics if t in meta and meta[t].error is None}


def delete_topics_with_prefixes(cluster: ClusterLike, prefixes: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Delete every topic whose name starts with one of `prefixes`, best effort: a topic that
    cannot be deleted is left. Returns the names asked to be deleted."""
    admin = clients.admin(cluster)
    try:
        topics = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    mine = [t for t in topics if t.startswith(tuple(prefixes))]
    if mine:
        for future in admin.delete_topics(mine, operation_timeout=timeout).values():
            try:
                future.result()
            except KafkaException:  # best effort: the caller names what it leaves behind
                pass
    return mine
