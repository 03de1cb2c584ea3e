"""Secondary queues (NServiceBus callbacks): a per-instance topic `<queue topic>.<instance>` that
receives the replies on dialogs an instance began with `instance=`, so a reply comes back to the
process that sent the request and to no other instance of the same queue.

The topic is created on demand, with the primary queue's topic config (every record kept until reclaimed), by whoever
needs it first (BEGIN DIALOG or RECEIVE on the instance); creating it again changes nothing.
"""

from __future__ import annotations

from kbroker.core import names
from kbroker.core.catalog.models import Queue
from kbroker.core.cluster import ClusterLike
from kbroker.kafka.catalog.apply import sync_topics
from kbroker.kafka.catalog.topic_specs import TopicSpec, queue_topic_config

PARTITIONS = 1  # replies to one instance: key-level concurrency inside one partition is enough


def ensure_secondary_queue(
    cluster: ClusterLike, namespace: str, queue: Queue, instance: str, timeout: float = 30.0
) -> str:
    """Create the secondary queue topic if it does not exist; returns its name."""
    topic = names.secondary_queue_topic(namespace, queue.name, instance)
    sync_topics(
        cluster,
        [TopicSpec(topic, PARTITIONS, queue_topic_config(queue), f"secondary queue {topic}", True)],
        timeout=timeout,
    )
    return topic
