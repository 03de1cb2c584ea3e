"""Storage never deletes an unreceived message, and what readers have received is reclaimed
(G3; kafka/receive/reclaim.py), on a broker of its own whose log retention is one minute and whose
retention check runs every second."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.envelope import Envelope
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.queue_views import queue_view
from kbroker.kafka.receive.reclaim import reclaim_namespace
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, embedded_kafka, wait_for

SHORT_RETENTION = {
    "log.retention.ms": "60000",
    "log.retention.check.interval.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
}
EIGHT_DAYS_MS = 8 * 86_400_000  # older than Kafka's default retention (7 days) and its segment roll


@pytest.fixture(scope="module")
def short_retention_bootstrap(tmp_path_factory) -> Iterator[str]:
    with embedded_kafka(tmp_path_factory.mktemp("short-retention"), SHORT_RETENTION) as bootstrap:
        yield bootstrap


def log_start(admin: AdminClient, topic: str, partition: int) -> int:
    tp = TopicPartition(topic, partition)
    return admin.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=10)[tp].result().offset


def claim_record(seq: int) -> tuple[bytes, list]:
    """A well-formed first message of a new dialog from the employees' service, as a record."""
    conversation = str(uuid.uuid4())
    env = Envelope(str(uuid.uuid4()), conversation, conversation, seq, CLAIM, CONTRACT, EMP, EXP, "TARGET")
    return conversation.encode(), env.headers()


@pytest.mark.long  # 35 s of the broker's retention: `make test-long`
def test_an_unreceived_message_outlives_the_brokers_retention_and_received_ones_are_reclaimed(
    short_retention_bootstrap,
):
    bootstrap, ns = short_retention_bootstrap, "r" + uuid.uuid4().hex[:10]
    apply_paths(bootstrap, ns, [SAMPLES])
    queue = names.queue_topic(ns, "ExpenseQueue")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    control = f"{ns}.control"  # a topic with the broker's own one-minute retention
    admin.create_topics([NewTopic(control, 1, 1)])[control].result(timeout=30)

    # One message eight days old on partition 0, then a fresh one: the second append rolls the
    # segment (its first record is older than the 7-day roll), so the retention check may
    # delete the old segment. The control topic gets the same two records.
    producer = Producer({"bootstrap.servers": bootstrap})
    old = int(time.time() * 1000) - EIGHT_DAYS_MS
    for stamp in (old, 0):
        key, headers = claim_record(0)
        producer.produce(
            queue,
            key=key,
            value=b'{"amount": 1}',
            headers=headers,
            partition=0,
            **({"timestamp": stamp} if stamp else {}),
        )
        producer.produce(control, value=b"x", partition=0, **({"timestamp": stamp} if stamp else {}))
        assert producer.flush(30) == 0  # one batch each: a batch is never split across segments

    # The broker's retention check has run and deleted the control topic's old segment ...
    wait_for(lambda: log_start(admin, control, 0) == 1, 60, "the control topic's old record to be deleted")
    # ... and the queue keeps both messages: neither was received.
    assert log_start(admin, queue, 0) == 0
    assert queue_view(bootstrap, ns, "ExpenseQueue")["totals"]["ready"] == 2
    with Broker(bootstrap, ns) as b:
        got = wait_for(lambda: b.receive("ExpenseQueue", wait=1) or None, 30, "the messages")
        got += b.receive("ExpenseQueue", wait=2)
        assert len(got) == 2 and {m.body for m in got} == {b'{"amount": 1}'}

    # Received (committed): the next reclaim deletes them, and only them.
    view = queue_view(bootstrap, ns, "ExpenseQueue")
    committed = {p["partition"]: p["committed"] for p in view["partition_offsets"]}
    assert committed[0] is not None and committed[0] >= 2
    done = reclaim_namespace(bootstrap, read_catalog(bootstrap, ns))
    assert [(r.topic, r.deleted_below) for r in done] == [(queue, {0: committed[0]})]
    assert log_start(admin, queue, 0) == committed[0]
    after = queue_view(bootstrap, ns, "ExpenseQueue")
    assert after["partition_offsets"][0]["start"] == committed[0]
    assert all(p["bytes"] is not None for p in after["partition_offsets"])
    assert reclaim_namespace(bootstrap, read_catalog(bootstrap, ns)) == []  # nothing more to do


def test_apply_moves_an_older_namespace_to_keep_every_record(kafka_bootstrap, namespace):
    """A queue topic created with a time retention (as kbroker did before) is changed by the
    next apply, which names the topic and the setting."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    topic = names.queue_topic(namespace, "ExpenseQueue")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    old = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "604800000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([old])[old].result(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, topic)
    # The controller answers once the change is in the metadata log; the broker that describes the
    # topic applies it a moment later, and an apply that read the old value had nothing to change.
    wait_for(
        lambda: admin.describe_configs([res])[res].result(timeout=30)["retention.ms"].value == "604800000",
        30,
        "the broker to describe the older retention",
    )

    report = apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    assert report.retention_changed == [f"{topic}: retention.ms 604800000 -> -1"]
    config = admin.describe_configs([res])[res].result(timeout=30)
    assert (config["retention.ms"].value, config["retention.bytes"].value) == ("-1", "-1")
    assert apply_paths(kafka_bootstrap, namespace, [SAMPLES]).retention_changed == []


def test_closed_endpoints_are_reclaimed_after_the_grace_period(kafka_bootstrap, namespace, broker):
    """Both sides of an ended dialog are CLOSED: kept for the grace period (30 minutes by
    default), then tombstoned by the reclaim; a process reading them past the grace does not
    keep them. A live dialog is never touched."""
    from kbroker.core.dialogs.conversation_endpoint import CLOSED
    from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
    from kbroker.kafka.receive.reclaim import reclaim_endpoints

    ended = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(ended, CLAIM, {"amount": 1})
    target = wait_for(lambda: broker.receive("ExpenseQueue", wait=1) or None, 30, "the claim")[0].conversation_handle
    broker.end_conversation(target)
    wait_for(lambda: broker.receive("EmployeeQueue", wait=1) or None, 30, "the EndDialog")
    broker.end_conversation(ended)
    # The target's acknowledgement: the initiator's EndDialog closes it (nothing is delivered).
    wait_for(
        lambda: broker.receive("ExpenseQueue", wait=1) == [] and broker.endpoints.get(target).state == CLOSED,
        30,
        "the target endpoint to close",
    )
    live = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(live, CLAIM, {"amount": 2})

    def fresh(grace: float | None = None) -> EndpointStore:
        store = EndpointStore(kafka_bootstrap, namespace, Producer({"bootstrap.servers": kafka_bootstrap}))
        if grace is not None:
            store.grace = grace
        return store

    store = fresh()
    assert {store.get(h).state for h in (ended, target)} == {CLOSED}  # within the grace period
    store.close()
    store = fresh(grace=0.0)  # read as if the grace period had passed: not kept
    assert store.find(ended) is None and store.find(target) is None and store.find(live) is not None
    assert {ep.conversation_handle for ep in store.all()} == {live}
    store.close()

    assert reclaim_endpoints(kafka_bootstrap, namespace, grace=3600) == 0  # too recent
    assert reclaim_endpoints(kafka_bootstrap, namespace, grace=0.0, now=time.time() + 1) == 2
    store = fresh()  # the default grace: gone all the same, by their tombstones
    assert store.find(ended) is None and store.find(target) is None and store.find(live) is not None
    store.close()
    assert reclaim_endpoints(kafka_bootstrap, namespace, grace=0.0, now=time.time() + 1) == 0


def test_forged_analytics_positions_hold_nothing_back(kafka_bootstrap, namespace, broker):
    """The analytics job's read positions are its group's committed offsets, which anyone who may
    commit for that group can write: positions with garbage in their timestamp, and one stamped a
    day ahead (which would make the job look alive and hold every partition it has no position
    for, for ever), do not stop the reclaim of what readers received."""
    from kbroker.kafka import clients

    for i in range(8):
        h = broker.begin_dialog(EMP, EXP, CONTRACT)
        broker.send(h, CLAIM, {"employee": "e", "amount": i, "item": "x"})
    got: list = []
    while len(got) < 8:
        batch = broker.receive("ExpenseQueue", top=10, wait=5)
        assert batch, got
        got += batch
    topic = names.queue_topic(namespace, "ExpenseQueue")
    ahead = str(int((time.time() + 86_400) * 1000))
    forger = clients.consumer(kafka_bootstrap, names.analytics_group(namespace))
    try:
        forger.commit(
            offsets=[
                TopicPartition(topic, 0, 0, metadata="not a time"),
                TopicPartition(topic, 1, 0, metadata=ahead),
                TopicPartition(topic, 2, 10**12, metadata="\xff" * 200),
            ],
            asynchronous=False,
        )
    finally:
        forger.close()
    busy = sorted(
        p
        for p, n in enumerate(queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["partition_offsets"])
        if n["committed"]
    )
    done = {
        r.topic: r.deleted_below for r in reclaim_namespace(kafka_bootstrap, read_catalog(kafka_bootstrap, namespace))
    }
    assert sorted(done.get(topic, {})) == busy and busy, (done, busy)
