"""Transport queues keep every record until received; the 5th-tick reclaim deletes what the
queue's consumer group committed past, and nothing that is still waiting."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kbroker.core.catalog.models import Catalog
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.kafka.receive.reclaim import reclaim_namespace
from kbroker.sdk.transport.endpoint import TransportEndpoint


def log_starts(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    tps = {TopicPartition(topic, p): OffsetSpec.earliest() for p in range(partitions)}
    return {tp.partition: f.result().offset for tp, f in admin.list_offsets(tps, request_timeout=10).items()}


def test_reclaim_deletes_received_transport_messages_only(kafka_bootstrap, namespace):
    topic = transport_queue_topic(namespace, "Stock")
    with TransportEndpoint(
        "Stock", cluster=kafka_bootstrap, namespace=namespace, machine="m", secondary=False, install=True, partitions=1
    ) as ep:
        ids = [ep.send("Stock", f"item {i}".encode()) for i in range(10)]
        got = [ep.receive(wait=20) for _ in range(6)]
        assert [m.id for m in got if m is not None] == ids[:6]  # oldest first on one partition
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert log_starts(admin, topic, 1) == {0: 0}
    done = reclaim_namespace(kafka_bootstrap, Catalog(namespace=namespace))
    assert [(r.topic, r.deleted_below) for r in done] == [(topic, {0: 6})]
    assert log_starts(admin, topic, 1) == {0: 6}
    # The four still waiting are there for the next reader, in order.
    with TransportEndpoint("Stock", cluster=kafka_bootstrap, namespace=namespace, machine="m", secondary=False) as ep:
        rest = [ep.receive(wait=20) for _ in range(4)]
        assert [m.id for m in rest if m is not None] == ids[6:]
        assert [m.row_version for m in rest if m is not None] == [6, 7, 8, 9]
    assert reclaim_namespace(kafka_bootstrap, Catalog(namespace=namespace))[0].deleted_below == {0: 10}
