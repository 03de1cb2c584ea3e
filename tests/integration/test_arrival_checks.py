"""RECEIVE checks every record it reads as SEND checks one it writes (G6, G8): records another
Kafka client wrote straight onto a queue topic, with well-formed kb.* headers, that SEND would
have refused. Each is dead-lettered with its reason and an event, never delivered, and the
dialog's good messages around it are received once and in order. Every count is read back by a
plain read_committed consumer."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import default_group
from kbroker.core.dialogs.envelope import Envelope
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import END_DIALOG, Broker
from tests.helpers import SAMPLES


def committed_records(bootstrap: str, topic: str, timeout: float = 15.0) -> list:
    """Every committed record of `topic`, by a plain read_committed consumer read to its end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        parts = sorted(meta.partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        left, out, deadline = set(parts), [], time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    out.append(m)
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
        return out
    finally:
        c.close()


def forge(bootstrap: str, namespace: str, conversation: str, seq: int, body: bytes, *, group: str | None = None) -> str:
    """A CLAIM to the target of `conversation` written by a plain producer: it never passed SEND."""
    group = group or default_group(conversation, "TARGET")
    env = Envelope(str(uuid.uuid4()), conversation, group, seq, CLAIM, CONTRACT, EMP, EXP, "TARGET")
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        names.queue_topic(namespace, "ExpenseQueue"), key=group.encode(), value=body, headers=env.headers()
    )
    assert producer.flush(30) == 0
    return env.message_id


def receive_until(broker: Broker, queue: str, count: int, timeout: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += broker.receive(queue, top=10, wait=1)
    return got


def set_aside(bootstrap: str, namespace: str, message_id: str) -> tuple[list[str], list[dict]]:
    """The dead letters of `message_id` (their reasons) and the events naming them."""
    letters = [
        m
        for m in committed_records(bootstrap, names.deadletter_topic(namespace))
        if dict(m.headers() or []).get("kb.message_id") == message_id.encode()
    ]
    reasons = [dict(m.headers())["kb.dlq.reason"].decode() for m in letters]
    events = [orjson.loads(m.value()) for m in committed_records(bootstrap, names.events_topic(namespace))]
    offsets = {(int(dict(m.headers())["kb.dlq.partition"]), int(dict(m.headers())["kb.dlq.offset"])) for m in letters}
    named = [
        e
        for e in events
        if e.get("event") == "MESSAGE_DEAD_LETTERED" and (e.get("partition"), e.get("offset")) in offsets
    ]
    return reasons, named


def test_a_sequence_number_no_sender_can_have_reached_is_dead_lettered(kafka_bootstrap, namespace, broker):
    """A record with sequence 10**12 on a live dialog: before, it was delivered, or, taken with
    the dialog's later EndDialog, sorted after it and dead-lettered as arriving after the end.
    Now it is dead-lettered for its sequence number; the dialog's own messages and its EndDialog
    are received once, in order."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    good = [broker.send(h, CLAIM, {"n": 0}), broker.send(h, CLAIM, {"n": 1})]
    conversation = broker.endpoints.get(h).conversation_id
    bogus = forge(kafka_bootstrap, namespace, conversation, 10**12, b'{"n": "bogus"}')
    good.append(broker.send(h, CLAIM, {"n": 2}))
    broker.end_conversation(h)

    got = receive_until(broker, "ExpenseQueue", 4)
    assert [m.message_type_name for m in got] == [CLAIM, CLAIM, CLAIM, END_DIALOG]
    assert [m.message_id for m in got[:3]] == good
    assert [m.message_sequence_number for m in got] == [0, 1, 2, 3]
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []
    reasons, events = set_aside(kafka_bootstrap, namespace, bogus)
    assert len(reasons) == 1 and "sequence number 1000000000000" in reasons[0], reasons
    assert len(events) == 1 and events[0]["reason"] == reasons[0], events


def test_a_body_over_the_queues_limit_is_dead_lettered(kafka_bootstrap, namespace, tmp_path):
    """A body over the queue's max_message_bytes (which SEND refuses) was delivered when another
    client wrote it. Now it is dead-lettered with the -9602 reason the dispatcher gives a routed
    one. (A queue of 1,000 bytes: the dead-letter topic's own size limit is not this test's.)"""
    text = (Path(SAMPLES) / "expenses.yaml").read_text()
    small = text.replace("  - name: ExpenseQueue\n", "  - name: ExpenseQueue\n    max_message_bytes: 1000\n")
    assert small != text
    (tmp_path / "expenses.yaml").write_text(small)
    apply_paths(kafka_bootstrap, namespace, [tmp_path])
    with Broker(kafka_bootstrap, namespace) as broker:
        h = broker.begin_dialog(EMP, EXP, CONTRACT)
        big = orjson.dumps({"pad": "x" * 1990})
        with pytest.raises(errors.MessageTooLargeError):
            broker.send(h, CLAIM, big)  # SEND's own check
        first = broker.send(h, CLAIM, {"n": 0})
        conversation = broker.endpoints.get(h).conversation_id
        bogus = forge(kafka_bootstrap, namespace, conversation, 1, big)
        h2 = broker.begin_dialog(EMP, EXP, CONTRACT)
        second = broker.send(h2, CLAIM, {"n": 1})

        got = receive_until(broker, "ExpenseQueue", 2)
        assert sorted(m.message_id for m in got) == sorted([first, second])
        assert broker.receive("ExpenseQueue", top=10, wait=1) == []
        reasons, events = set_aside(kafka_bootstrap, namespace, bogus)
    assert len(reasons) == 1 and "-9602" in reasons[0] and "at most 1000" in reasons[0], reasons
    assert len(events) == 1, events


def test_a_message_for_a_closed_endpoint_is_dead_lettered_with_an_event(kafka_bootstrap, namespace, broker):
    """A message arriving for a CLOSED endpoint was consumed and dropped with no trace. Now it
    is dead-lettered with its reason and a MESSAGE_DEAD_LETTERED event; the queue goes on."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 0})
    broker.end_conversation(h)  # the initiator ends: DISCONNECTED_OUTBOUND
    got = receive_until(broker, "ExpenseQueue", 2)
    assert [m.message_type_name for m in got] == [CLAIM, END_DIALOG]
    target = got[0].conversation_handle
    broker.end_conversation(target)  # after the peer's end: CLOSED at once
    assert broker.endpoints.get(target).state == "CD"
    bogus = forge(kafka_bootstrap, namespace, got[0].conversation_id, 2, b'{"n": "after"}')
    h2 = broker.begin_dialog(EMP, EXP, CONTRACT)
    after = broker.send(h2, CLAIM, {"n": 1})

    assert [m.message_id for m in receive_until(broker, "ExpenseQueue", 1)] == [after]
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []
    reasons, events = set_aside(kafka_bootstrap, namespace, bogus)
    assert len(reasons) == 1 and "CLOSED" in reasons[0], reasons
    assert len(events) == 1 and events[0]["queue"] == "ExpenseQueue", events
