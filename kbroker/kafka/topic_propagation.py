"""Waiting until topics just created are known everywhere a client may ask.

CreateTopics returns once the controller has the topics; each broker learns of them from the
metadata log a moment later, and a broker that has not yet answers a metadata request as if
they did not exist (librdkafka's topic.metadata.propagation.max.ms exists for this). A client
started right after `kbroker apply` asks whichever broker it reaches first, so apply waits until
every broker, asked on its own, names the topics with a leader for every partition."""

from __future__ import annotations

import concurrent.futures
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient

from kbroker.core.cluster import ClusterLike
from kbroker.errors import denied_code
from kbroker.kafka import clients
from kbroker.kafka.snapshot import topic_partitions


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


def _wait_known(
    client: AdminClient, topics: list[str], deadline: float, cluster: ClusterLike | None = None
) -> list[str] | None:
    """The brokers' addresses once `client`'s answer names every topic with leaders; None at the
    deadline. With `cluster`, a topic the principal may not DESCRIBE raises PermissionDeniedError.
    The topics are asked for by name (DescribeTopics never creates a topic), so each answer costs
    the broker these topics, not every topic of the cluster."""
    while True:
        left = max(0.1, deadline - time.monotonic())
        if _described(client, topics, left, cluster):
            try:
                return [f"{n.host}:{n.port}" for n in clients.broker_nodes(client, left)]
            except (KafkaException, concurrent.futures.TimeoutError):
                pass  # asked again until the deadline
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _described(client: AdminClient, topics: list[str], timeout: float, cluster: ClusterLike | None) -> bool:
    """Whether the answer names every one of `topics` with a leader for each partition."""
    known = True
    for name, future in client.describe_topics(TopicCollection(topics), request_timeout=timeout).items():
        try:
            described = future.result(timeout + 5)
        except KafkaException as exc:
            if cluster is not None and denied_code(exc.args[0]):
                raise clients.denied(
                    cluster, exc.args[0], f"cannot see topic {name} after creating it", topic=("DESCRIBE", name)
                ) from None
            known = False
            continue
        except concurrent.futures.TimeoutError:
            return False
        known = (
            known
            and bool(described.partitions)
            and all(p.leader is not None and p.leader.id >= 0 for p in described.partitions)
        )
    return known


PROPAGATION_GRACE = 5.0  # seconds a topic may look missing on one broker after its creation


def partitions_after_propagation(
    client: Consumer | Producer,
    topic: str,
    timeout: float,
    grace: float = PROPAGATION_GRACE,
    *,
    never_creates: bool = False,
) -> list[int] | None:
    """topic_partitions, but a topic missing from the answer is asked for again for up to `grace`
    seconds (bounded by `timeout`) before it is called missing: the broker asked may not have
    learned of a topic created a moment ago by another client."""
    deadline = time.monotonic() + min(grace, timeout)
    while True:
        partitions = topic_partitions(client, topic, timeout, never_creates=never_creates)
        if partitions is not None or time.monotonic() >= deadline:
            return partitions
        time.sleep(0.2)
