"""Waiting until topics just created are known everywhere a client may ask.

CreateTopics returns once the controller has the topics; each broker learns of them from the
metadata log a moment later, and a broker that has not yet answers a metadata request as if
they did not exist (librdkafka's topic.metadata.propagation.max.ms exists for this). A client
started right after `kbroker apply` asks whichever broker it reaches first, so apply waits until
every broker, asked on its own, names the topics with a leader for every partition."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient

from kbroker.core.cluster import ClusterLike
from kbroker.errors import denied_code
from kbroker.kafka import clients
from kbroker.kafka.reader import topic_partitions


def await_topics(cluster: ClusterLike, admin: AdminClient, topics: list[str], timeout: float) -> list[str]:
    """Wait (at most `timeout` seconds) until every broker knows `topics` with their leaders.
    Returns the brokers ("host:port") that still did not at the deadline; PermissionDeniedError
    when the principal may not DESCRIBE one of them (hidden, it would look missing for good)."""
    if not topics:
        return []
    deadline = time.monotonic() + timeout
    brokers = _wait_known(admin, topics, deadline, cluster)
    if brokers is None:
        return ["the cluster's answer"]
    late = []
    for address in brokers:
        # A new client's first metadata request goes to its one bootstrap broker.
        alone = clients.admin(cluster, **{"bootstrap.servers": address})
        if _wait_known(alone, topics, deadline) is None:
            late.append(address)
    return late


def _wait_known(client: AdminClient, topics: list[str], deadline: float,
                cluster: ClusterLike | None = None) -> list[str] | None:
    """The brokers' addresses once `client`'s answer names every topic with leaders; None at the
    deadline. With `cluster`, a topic still missing on the first answer is asked for by name."""
    asked = cluster is None
    while True:
        left = deadline - time.monotonic()
        try:
            meta = client.list_topics(timeout=max(0.1, left))
            known = meta.topics
        except KafkaException:
            meta, known = None, {}
        if meta is not None and all(
                t in known and not known[t].error and known[t].partitions
                and all(p.leader >= 0 for p in known[t].partitions.values()) for t in topics):
            return [f"{b.host}:{b.port}" for b in meta.brokers.values()]
        if not asked and cluster is not None:
            asked = True
            check_visible(cluster, client, [t for t in topics if t not in known], max(0.1, left))
        if left <= 0:
            return None
        time.sleep(0.1)


def check_visible(cluster: ClusterLike, admin: AdminClient, topics: list[str], timeout: float) -> None:
    """PermissionDeniedError for the first of `topics` the principal may not DESCRIBE (asked by
    name: an answer about all topics leaves it out as if it did not exist). DescribeTopics
    never creates a topic."""
    if not topics:
        return
    for name, future in admin.describe_topics(TopicCollection(topics), request_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            if denied_code(exc.args[0]):
                raise clients.denied(cluster, exc.args[0], f"cannot see topic {name} after creating it",
                                     topic=("DESCRIBE", name)) from None


PROPAGATION_GRACE = 5.0  # seconds a topic may look missing on one broker after its creation


def partitions_after_propagation(client: Consumer | Producer, topic: str, timeout: float,
                                 grace: float = PROPAGATION_GRACE) -> list[int] | None:
    """topic_partitions, but a topic missing from the answer is asked for again for up to `grace`
    seconds (bounded by `timeout`) before it is called missing: the broker asked may not have
    learned of a topic created a moment ago by another client."""
    deadline = time.monotonic() + min(grace, timeout)
    while True:
        partitions = topic_partitions(client, topic, timeout)
        if partitions is not None or time.monotonic() >= deadline:
            return partitions
        time.sleep(0.2)
