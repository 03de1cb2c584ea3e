"""Records that cannot stay on their queue: every topic a record may move to takes it, and one
that still cannot move is set aside with an event instead of holding its partition."""

from __future__ import annotations

import time

import orjson
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from prometheus_client import REGISTRY

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.catalog.models import MAX_QUEUE_MESSAGE_BYTES
from kbroker.core.transport.endpoint import install_plan, transport_queue_topic
from kbroker.kafka import clients
from kbroker.kafka.snapshot import committed_offsets, read_to_end
from kbroker.kafka.transport.queues import install
from kbroker.sdk.broker import Broker

KAFKA_DEFAULT_LIMIT = 1_048_588  # a topic's max.message.bytes when nothing sets it
BIG = 1_060_011  # over Kafka's default, under the queue topic's 1 MiB + 64 KiB


def topic_limits(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = clients.admin(bootstrap)
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
    return {res.name: int(f.result()["max.message.bytes"].value) for res, f in futures.items()}


def test_every_topic_a_record_moves_to_takes_it(kafka_bootstrap, namespace, broker):
    """A queue record may move to the dead-letter topic (with kb.dlq.* headers added), a SEND to
    another namespace goes through the transmission and inbound topics to a queue of up to 10 MiB,
    a transport queue's poison message to the dead-letter topic. Each destination takes the
    largest record its sources hold. Before, the dead-letter, transmission and inbound topics kept
    Kafka's default of about 1 MB while a queue topic took up to 10 MiB + 64 KiB."""
    install(kafka_bootstrap, namespace, install_plan("Sales", "m1", secondary=False, partitions=1))
    queue, tqueue = names.queue_topic(namespace, "ExpenseQueue"), transport_queue_topic(namespace, "Sales")
    dead, transmission, inbound = (
        names.deadletter_topic(namespace),
        names.transmission_topic(namespace),
        names.system_topic(namespace, "inbound"),
    )
    limits = topic_limits(kafka_bootstrap, [queue, tqueue, dead, transmission, inbound])
    largest_source = MAX_QUEUE_MESSAGE_BYTES + 64 * 1024  # a queue of the largest max_message_bytes
    assert limits[transmission] >= largest_source and limits[inbound] >= limits[transmission], limits
    assert limits[tqueue] <= largest_source and limits[queue] <= largest_source, limits
    assert limits[dead] > max(largest_source, limits[inbound], limits[tqueue]), limits


def test_an_oversized_malformed_record_is_set_aside_and_its_partition_moves_on(kafka_bootstrap, namespace, broker):
    """A malformed record too large for the dead-letter topic (here one whose limit is Kafka's
    default, as a namespace applied before the limits were made consistent has it) is set aside:
    its dead letter goes without the body, with the reason and where it came from, and a
    RECORD_SET_ASIDE event says so. Its neighbours are dead-lettered, the valid messages around it
    are received once without a RECEIVE aborting, and the partition's committed offset moves past
    all of them. Before, the group commit's transaction failed with the large dead letter in it,
    the other dead letters of that batch were lost, and the offset stayed at the record for good."""
    dead = names.deadletter_topic(namespace)
    admin = clients.admin(kafka_bootstrap)
    for f in admin.incremental_alter_configs(
        [
            ConfigResource(
                ResourceType.TOPIC,
                dead,
                incremental_configs=[
                    ConfigEntry(
                        "max.message.bytes", str(KAFKA_DEFAULT_LIMIT), incremental_operation=AlterConfigOpType.SET
                    )
                ],
            )
        ]
    ).values():
        f.result()
    topic = names.queue_topic(namespace, "ExpenseQueue")
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    sent = [broker.send(handle, CLAIM, {"n": 0})]
    probe = clients.consumer(kafka_bootstrap, names.reader_group(namespace))
    try:
        ends = [probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(4)]
    finally:
        probe.close()
    partition = ends.index(1)  # where the dialog's group is, and its messages
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2_000_000})
    sizes = [10, 20, BIG, 30, 40, 50]
    for i, size in enumerate(sizes):
        producer.produce(topic, partition=partition, key=f"malformed-{i}".encode(), value=b"x" * size)
    assert producer.flush(30) == 0
    sent += [broker.send(handle, CLAIM, {"n": n}) for n in (1, 2)]

    reader = Broker(kafka_bootstrap, namespace)
    try:
        received, aborted = [], 0
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            try:
                received += [m.message_id for m in reader.receive("ExpenseQueue", top=10, wait=1)]
            except errors.TransactionAbortedError:
                aborted += 1
        assert sorted(received) == sorted(sent), received
        found = wait_for_records(kafka_bootstrap, dead, len(sizes), 20)
        end = ends[partition] + len(sizes) + 2
        group = names.queue_group(namespace, "ExpenseQueue")

        def committed() -> int:
            return committed_offsets(kafka_bootstrap, group, [TopicPartition(topic, partition)], 10)[0].offset

        deadline = time.monotonic() + 10
        while committed() < end and time.monotonic() < deadline:
            time.sleep(0.3)
        moved_to = committed()
    finally:
        reader.close()

    by_offset = {int(dict(m.headers())["kb.dlq.offset"]): m for m in found}
    assert len(found) == len(sizes) == len(by_offset), [dict(m.headers()).get("kb.dlq.offset") for m in found]
    big = [m for m in found if int(dict(m.headers()).get("kb.dlq.size", b"0")) == BIG]
    assert len(big) == 1 and big[0].value() is None, "the large record's dead letter goes without its body"
    big_headers = dict(big[0].headers())
    assert big_headers["kb.dlq.reason"] and big_headers["kb.dlq.topic"].decode() == topic
    assert sorted(len(m.value() or b"") for m in found) == [0, 10, 20, 30, 40, 50]

    events = [orjson.loads(m.value()) for m in read_to_end(kafka_bootstrap, names.events_topic(namespace), 5) or []]
    set_aside = [e for e in events if e.get("event") == "RECORD_SET_ASIDE"]
    assert len(set_aside) == 1 and set_aside[0]["topic"] == topic and set_aside[0]["size"] == BIG, events
    assert set_aside[0]["offset"] == int(big_headers["kb.dlq.offset"])
    kept = {
        k: REGISTRY.get_sample_value(
            "kbroker_dead_letters_total",
            {"namespace": namespace, "queue": "ExpenseQueue", "reason": "malformed", "kept": k},
        )
        for k in ("copy", "without_body", "event_only")
    }
    assert kept == {"copy": len(sizes) - 1, "without_body": 1, "event_only": None}, kept
    assert moved_to >= end, (moved_to, end)
    assert aborted == 0, "a RECEIVE aborted with the dead letters"

    with Broker(kafka_bootstrap, namespace) as again:
        assert again.receive("ExpenseQueue", top=10, wait=3) == []
    assert len(read_to_end(kafka_bootstrap, dead, 5) or []) == len(sizes)


def wait_for_records(bootstrap: str, topic: str, count: int, timeout: float) -> list:
    """The topic's committed records once there are `count` of them, or what is there after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = read_to_end(bootstrap, topic, 5) or []
        if len(got) >= count or time.monotonic() >= deadline:
            return got
        time.sleep(0.3)
