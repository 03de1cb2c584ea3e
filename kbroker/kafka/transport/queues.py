"""Transport queues on Kafka: the installer's topics, the check that a destination exists, the
receiver that reads transport messages, and the producers of sends outside a transaction.

A transport queue's topic keeps every record, as a Service Broker queue's does (a message waits
for its reader however long that takes); the endpoint reclaims what its group has committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import KafkaException, Producer
from confluent_kafka import Message as KafkaRecord

from kbroker.core import names
from kbroker.core.catalog.loader import load_system_topics
from kbroker.core.cluster import ClusterLike
from kbroker.core.topic_limits import LARGEST_BODY, MESSAGE_TOPIC_LIMIT
from kbroker.core.transport.bridge import bridge_topic, destination_topic
from kbroker.core.transport.delayed import delayed_topic
from kbroker.core.transport.endpoint import (
    PRIMARY_PARTITIONS,
    InstallPlan,
    install_collision,
    transport_queue_prefix,
    transport_queue_topic,
)
from kbroker.core.transport.message import TransportEnvelope, as_envelope, from_record
from kbroker.core.transport.subscriptions import subscriptions_topic
from kbroker.errors import InvalidArgumentError, QueueNameCollisionError, TransportQueueNotFoundError, kafka_error
from kbroker.kafka import clients, messages
from kbroker.kafka.catalog.apply import sync_topics
from kbroker.kafka.catalog.topic_specs import KEEP_EVERY_RECORD, QUEUE_SEGMENTS, TopicSpec, system_topic_config
from kbroker.kafka.receive.receiver import QueueReceiver
from kbroker.kafka.snapshot import topic_partitions
from kbroker.kafka.transport.delayed_store import store_spec
from kbroker.kafka.transport.subscription_store import table_spec

MAX_BODY_BYTES = LARGEST_BODY  # the largest body a transport queue takes (10 MiB)


def queue_config() -> dict[str, str]:
    return {
        "cleanup.policy": "delete",
        **KEEP_EVERY_RECORD,
        **QUEUE_SEGMENTS,
        "max.message.bytes": str(MESSAGE_TOPIC_LIMIT),
    }


def install(
    cluster: ClusterLike,
    namespace: str,
    plan: InstallPlan,
    *,
    timeout: float = 30.0,
    replication_factor: int | None = None,
) -> list[str]:
    """Create the plan's queue topics, its delayed store, and the namespace's subscription table
    and dead-letter topic where missing (the installer's CREATE TABLE); returns the topics created. Installing again
    changes nothing."""
    refuse_collisions(cluster, namespace, plan, timeout)
    dead = load_system_topics()["deadletter"]
    specs = [
        TopicSpec(
            names.deadletter_topic(namespace),
            dead.partitions,
            system_topic_config(dead),
            "system topic deadletter",
            False,
        )
    ]
    specs += [_queue_spec(namespace, q, partitions) for q, partitions in plan.queues]
    for shared in (plan.error, plan.audit):  # shared by the endpoints: created by the first installer
        if shared is not None:
            specs.append(_queue_spec(namespace, shared, PRIMARY_PARTITIONS))
    specs.append(table_spec(namespace))  # the namespace's subscription table, as the dead-letter topic
    if plan.delayed is not None:  # as many partitions as the primary queue: as many instances share it
        specs.append(store_spec(delayed_topic(namespace, plan.delayed), plan.queues[0][1], MESSAGE_TOPIC_LIMIT))
    for cluster_name in plan.bridges:  # one partition: one pusher, in the order they were sent
        specs.append(
            TopicSpec(bridge_topic(namespace, cluster_name), 1, queue_config(), f"bridge to {cluster_name}", True)
        )
    created, _updated, _retention = sync_topics(cluster, specs, timeout=timeout, replication_factor=replication_factor)
    return created


def _queue_spec(namespace: str, queue: str, partitions: int) -> TopicSpec:
    return TopicSpec(
        transport_queue_topic(namespace, queue), partitions, queue_config(), f"transport queue {queue}", True
    )


def refuse_collisions(cluster: ClusterLike, namespace: str, plan: InstallPlan, timeout: float = 30.0) -> None:
    """QueueNameCollisionError when the plan's queues would share a topic with (or be refused by
    Kafka beside) a transport queue installed earlier in the namespace (install_collision)."""
    prefix = transport_queue_prefix(namespace)
    try:
        topics = clients.admin(cluster).list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    collision = install_collision(plan, [t[len(prefix) :] for t in topics if t.startswith(prefix)])
    if collision is not None:
        queue, other, reason = collision
        raise QueueNameCollisionError(f"transport queue {queue!r}", f"installed transport queue {other!r}", reason)


class QueueDirectory:
    """Which transport queue topics exist, asked of the cluster once per queue (a send to a
    queue nobody installed fails at once, not at commit), through `client` (the endpoint's
    producer): a look-up that never creates the topic, whatever the broker's auto-create."""

    def __init__(self, namespace: str, client: Producer, timeout: float = 10.0):
        self._namespace, self._client, self._timeout = namespace, client, timeout
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def topic(self, queue: str) -> str:
        """The topic of `queue` (a queue of the namespace, or `queue@namespace`: one of another
        namespace on the cluster); TransportQueueNotFoundError when it does not exist."""
        try:
            topic = destination_topic(queue, self._namespace)  # `queue`, `queue@namespace` or on another cluster
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return self._checked(queue, topic)

    def exists(self, queue: str, fresh: bool = False) -> bool:
        """Whether the queue is installed (asked of the cluster while it is not; `fresh`: asked
        again even if it was, as after a write to it failed: it may have been removed)."""
        if fresh:
            with self._lock:
                try:
                    self._known.discard(destination_topic(queue, self._namespace))
                except ValueError:
                    return False
        try:
            self.topic(queue)
        except TransportQueueNotFoundError:
            return False
        return True

    def delayed_store(self, endpoint: str) -> str:
        """The topic of `endpoint`'s delayed store; TransportQueueNotFoundError when no installer
        created it (the endpoint is not installed, or was installed before delayed delivery)."""
        try:
            topic = delayed_topic(self._namespace, endpoint)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return self._checked(f"{endpoint} (its delayed store)", topic)

    def subscription_table(self) -> str:
        """The topic of the namespace's subscription table; TransportQueueNotFoundError when no
        installer created it (no endpoint installed since publish/subscribe existed)."""
        return self._checked("the subscription table", subscriptions_topic(self._namespace))

    def _checked(self, queue: str, topic: str) -> str:
        with self._lock:
            if topic not in self._known:
                if topic_partitions(self._client, topic, self._timeout) is None:
                    raise TransportQueueNotFoundError(queue, topic)
                self._known.add(topic)
        return topic


def decoder(queue: str) -> Callable[[KafkaRecord], TransportEnvelope]:
    """The receiver's decode for a transport queue: each message a group of its own."""

    def decode(rec: KafkaRecord) -> TransportEnvelope:
        return as_envelope(from_record(messages.raw_headers(rec), rec.value()), queue)

    return decode


def transport_receiver(
    cluster: ClusterLike,
    namespace: str,
    queue: str,
    topic: str,
    *,
    dead_letter: Callable[[QueueReceiver, KafkaRecord, str], None],
    commit_barrier: Callable[[Callable[[], None]], None],
    max_buffered: int = 20_000,
    revoke_grace: float = 5.0,
    committer_ids: tuple[str, ...] | None = None,
) -> QueueReceiver:
    """A started receiver of a transport queue (one consumer, in the queue's consumer group);
    `committer_ids`: the process's group committer's transactional ids (QueueReceiver)."""
    return QueueReceiver(
        cluster,
        namespace,
        queue,
        dead_letter=dead_letter,
        max_buffered=max_buffered,
        revoke_grace=revoke_grace,
        commit_barrier=commit_barrier,
        topic=topic,
        decode=decoder(queue),
        committer_ids=committer_ids,
    ).start()


def durable_producer(cluster: ClusterLike) -> Producer:
    """Recoverable sends outside a transaction: idempotent, acknowledged by every in-sync replica."""
    return clients.idempotent_producer(cluster)


def express_producer(cluster: ClusterLike) -> Producer:
    """Recoverable = false outside a transaction: the leader's acknowledgement only, not waited
    for by the sender (NServiceBus's express messages); a broker failure may lose them."""
    return clients.producer(
        cluster,
        **{"acks": 1, "enable.idempotence": False, "linger.ms": 5, "message.max.bytes": clients.MAX_MESSAGE_BYTES},
    )
