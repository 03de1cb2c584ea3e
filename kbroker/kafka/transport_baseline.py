"""What the transport benchmark's plain-Kafka baselines need besides kafka.clients and
kafka.baseline: committing explicit offsets from a partition-parallel consumer, and a share
consumer (KIP-932) of a transport queue. Kept here so the benchmark code holds no confluent-kafka
types."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, ShareConsumer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kbroker.kafka import clients
from kbroker.kafka.clients import kafka_error


def commit_offsets(consumer: Consumer, topic: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` (partition -> next offset to read) of `topic` for the consumer's group,
    synchronously."""
    if offsets:
        consumer.commit(offsets=[TopicPartition(topic, p, off) for p, off in sorted(offsets.items())],
                        asynchronous=False)


def share_group_reads_from_start(bootstrap: str, group: str, timeout: float = 30.0) -> None:
    """Set the share group's `share.auto.offset.reset` to `earliest` (a group config, set before
    its first member joins): a share group starts at the end of the log by default, so records
    written before it existed, a preloaded queue, would never be delivered."""
    admin = clients.admin(bootstrap)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout)
    except KafkaException as exc:
        raise kafka_error(f"could not configure share group {group!r}", exc.args[0]) from None


def share_consumer(bootstrap: str, group: str, topic: str, **overrides: Any) -> ShareConsumer:
    """A share consumer (KIP-932) of `topic` in share group `group`, acknowledging explicitly
    (acknowledge() each record, then commit_sync()); the group reads from the log's start."""
    share_group_reads_from_start(bootstrap, group)
    consumer = ShareConsumer(clients.base(bootstrap, **{"group.id": group, "share.acknowledgement.mode": "explicit",
                                                        **overrides}))
    consumer.subscribe([topic])
    return consumer
