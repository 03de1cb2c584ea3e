"""A message of the largest size any queue takes (MAX_QUEUE_MESSAGE_BYTES, 10 MiB), end to end
on the real broker: sent to another namespace (the sender's transmission topic, its transmitter's
link, the far inbound topic, the far dispatcher, the far queue) it is received whole; a record
of that size that the far side will not deliver is kept whole on the dead-letter topic. One
byte more is a MessageTooLargeError at SEND that names the limit, and nothing is written.
Before core/topic_limits.py, the dead-letter, transmission and inbound topics kept Kafka's 1 MiB
default, so such a message failed at every retry."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from kbroker.core import names
from kbroker.core.catalog.models import MAX_QUEUE_MESSAGE_BYTES
from kbroker.core.dialogs.envelope import H_TO_SIDE
from kbroker.core.topic_limits import DEAD_LETTER_LIMIT, MESSAGE_TOPIC_LIMIT
from kbroker.errors import MessageTooLargeError
from kbroker.kafka import clients
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.routing.dispatcher import Dispatcher
from kbroker.kafka.routing.transmitter import Transmitter
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import wait_for

BLOB, CONTRACT = "//Limits/Blob", "//Limits/Blobs"
CLIENT, SERVER = "//Limits/Client", "//Limits/Server"
LARGEST = MAX_QUEUE_MESSAGE_BYTES


def catalog(service: str, contracts: str, route: str) -> str:
    return f"""
message_types:
  - {{name: '{BLOB}', validation: NONE}}
contracts:
  - {{name: '{CONTRACT}', messages: [{{type: '{BLOB}', sent_by: INITIATOR}}]}}
queues:
  - {{name: Q, partitions: 1, max_message_bytes: {LARGEST}}}
services:
  - {{name: '{service}', queue: Q{contracts}}}
routes:
  - {route}
"""


@contextmanager
def routed(bootstrap: str, tmp_path: Path, a: str, b: str) -> Iterator[tuple[Broker, Broker]]:
    """Namespace `a` hosts CLIENT, `b` hosts SERVER, each with a route to the other, and each
    its dispatcher and transmitter running."""
    fa, fb = tmp_path / "a.yaml", tmp_path / "b.yaml"
    fa.write_text(catalog(CLIENT, "", f"{{name: ToB, service_name: '{SERVER}', address: 'kafka://{bootstrap}/{b}'}}"))
    fb.write_text(
        catalog(
            SERVER,
            f", contracts: ['{CONTRACT}']",
            f"{{name: ToA, service_name: '{CLIENT}', address: 'kafka://{bootstrap}/{a}'}}",
        )
    )
    apply_paths(bootstrap, a, [fa])
    apply_paths(bootstrap, b, [fb])
    with ExitStack() as stack:
        ba, bb = stack.enter_context(Broker(bootstrap, a)), stack.enter_context(Broker(bootstrap, b))
        for ns, br in ((a, ba), (b, bb)):
            stack.enter_context(Dispatcher(bootstrap, ns, lambda br=br: br.refresh_catalog(), tick=1.0))
            stack.enter_context(Transmitter(bootstrap, ns, lambda br=br: br.catalog, tick=1.0))
        yield ba, bb


def ends(bootstrap: str, topic: str) -> list[int]:
    c = clients.consumer(bootstrap, names.reader_group_of(topic) or "probe")
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in sorted(md.partitions)]
    finally:
        c.close()


def test_the_largest_message_is_routed_and_dead_lettered_whole(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    body = hashlib.sha256(b"seed").digest() * (LARGEST // 32)  # not compressible to nothing
    assert len(body) == LARGEST
    with routed(kafka_bootstrap, tmp_path, a, b) as (ba, bb):
        handle = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(handle, BLOB, body)

        got = wait_for(lambda: bb.receive("Q", top=1, wait=1), 90, "the 10 MiB message at the far queue")
        assert len(got) == 1 and got[0].body == body and got[0].message_type_name == BLOB

        # One byte more: refused at SEND, naming the limit, and nothing written anywhere.
        transmission = names.transmission_topic(a)
        before, sequence = ends(kafka_bootstrap, transmission), ba.endpoints.current(handle).send_sequence
        with pytest.raises(MessageTooLargeError) as refused:
            ba.send(handle, BLOB, body + b"x")
        assert refused.value.size == LARGEST + 1 and refused.value.limit == LARGEST
        assert str(LARGEST) in str(refused.value)
        with pytest.raises(MessageTooLargeError):
            with ba.transaction() as tx:
                tx.send(handle, BLOB, b"small")  # rolled back with the oversized one
                tx.send(handle, BLOB, body + b"x")
        assert ends(kafka_bootstrap, transmission) == before
        assert ba.endpoints.current(handle).send_sequence == sequence

        # The routed record as B's queue holds it, written again by another client with one
        # header spoiled: B's RECEIVE dead-letters it, whole, with its headers and the reasons.
        queue = names.queue_topic(b, "Q")
        saved = (read_to_end(kafka_bootstrap, queue) or [])[-1]
        assert saved.value() == body
        headers = [(k, b"SIDEWAYS" if k == H_TO_SIDE else v) for k, v in saved.headers() or []]
        raw = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": MESSAGE_TOPIC_LIMIT})
        raw.produce(queue, key=saved.key(), value=body, headers=headers)
        assert raw.flush(30) == 0
        assert bb.receive("Q", top=1, wait=5) == []  # nothing deliverable: it went to the dead letters
        dead = wait_for(lambda: read_to_end(kafka_bootstrap, names.deadletter_topic(b)), 30, "the dead letter")
        assert len(dead) == 1 and dead[0].value() == body
        dlq = dict(dead[0].headers() or [])
        assert b"SIDEWAYS" in dlq["kb.dlq.reason"] and "kb.dlq.omitted" not in dlq
        assert dlq[H_TO_SIDE] == b"SIDEWAYS" and dlq["kb.dlq.topic"] == queue.encode()
        assert len(body) < MESSAGE_TOPIC_LIMIT < DEAD_LETTER_LIMIT
