"""RETENTION = ON and the queue view (`broker.queue_messages`, `kbroker queue messages`) against the
real broker."""

from __future__ import annotations

import json
import os
import subprocess
import time

import orjson
import pytest
from confluent_kafka import Producer

from kbroker import errors
from kbroker.core import names
from kbroker.core.dialogs.retained import H_RETAINED_TYPE, RETAINED_MARKER
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.queue_views import queue_view
from kbroker.kafka.receive.reclaim import reclaim_namespace
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import KBROKER

CATALOG = """
message_types:
  - name: //t/Request
    validation: JSON
  - name: //t/Reply
    validation: JSON
contracts:
  - name: //t/RequestReply
    messages:
      - type: //t/Request
        sent_by: INITIATOR
      - type: //t/Reply
        sent_by: TARGET
queues:
  - name: Retained
    partitions: 2
    retention: ON
  - name: Plain
    partitions: 2
services:
  - name: //t/Server
    queue: Retained
    contracts: [//t/RequestReply]
  - name: //t/Client
    queue: Plain
    contracts: [//t/RequestReply]
"""


@pytest.fixture
def rb(kafka_bootstrap, namespace, tmp_path):
    path = tmp_path / "retention.yaml"
    path.write_text(CATALOG)
    apply_paths(kafka_bootstrap, namespace, [path])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


def statuses(rows: list[dict]) -> list[tuple[int, int]]:
    return [(r["message_sequence_number"], r["status"]) for r in rows]


def test_received_messages_stay_until_the_conversation_ends(rb):
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    other = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    for i in range(3):
        rb.send(h, "//t/Request", {"i": i})
    rb.send(other, "//t/Request", {"other": True})
    assert sorted(statuses(rb.queue_messages("Retained"))) == [(0, 1), (0, 1), (1, 1), (2, 1)]

    got = rb.receive("Retained", top=2, wait=15, conversation_handle=None)
    while got[0].conversation_id != rb.endpoints.get(h).conversation_id:
        got = rb.receive("Retained", top=2, wait=15)  # the other conversation came first
    target = got[0].conversation_handle
    assert statuses(rb.queue_messages("Retained", conversation_handle=target)) == [(0, 0), (1, 0), (2, 1)]
    rows = rb.queue_messages("Retained", conversation_handle=target)
    assert [r["message_body"] for r in rows] == ['{"i":0}', '{"i":1}', '{"i":2}']
    assert {r["conversation_handle"] for r in rows} == {target}

    # Received messages stay; the rest of the conversation is received; still all listed.
    assert [m.message_sequence_number for m in rb.receive("Retained", top=5, wait=15, conversation_handle=target)] == [
        2
    ]
    assert statuses(rb.queue_messages("Retained", conversation_handle=target)) == [(0, 0), (1, 0), (2, 0)]

    # END CONVERSATION on this side: its messages leave the view; the other conversation's stay.
    rb.end_conversation(target)
    assert rb.queue_messages("Retained", conversation_handle=target) == []
    rest = rb.queue_messages("Retained")
    assert len(rest) == 1 and rest[0]["conversation_handle"] != target


def test_reclaim_keeps_a_retained_conversation_until_this_side_ends_it(kafka_bootstrap, namespace, rb):
    """RETENTION = ON: the worker's reclaim deletes received records only up to the first record
    of a conversation the receiving side has not ended; once it ends, they go."""
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    for i in range(3):
        rb.send(h, "//t/Request", {"i": i})
    got = rb.receive("Retained", wait=15)
    assert [m.message_sequence_number for m in got] == [0, 1, 2]
    target, partition = got[0].conversation_handle, got[0].partition

    def log_start() -> int:
        view = queue_view(kafka_bootstrap, namespace, "Retained")
        return next(p["start"] for p in view["partition_offsets"] if p["partition"] == partition)

    assert reclaim_namespace(kafka_bootstrap, rb.catalog) == []  # received, but retained
    assert log_start() == 0
    assert statuses(rb.queue_messages("Retained", conversation_handle=target)) == [(0, 0), (1, 0), (2, 0)]

    rb.end_conversation(target)
    done = reclaim_namespace(kafka_bootstrap, rb.catalog)
    assert [r.topic for r in done] == [names.queue_topic(namespace, "Retained")]
    assert log_start() > got[-1].offset  # past the conversation's last record


def test_sent_messages_stay_in_the_senders_queue_as_status_3_until_it_ends(kafka_bootstrap, namespace, rb):
    """A RETENTION = ON queue keeps what its services send (status 3), in and outside a
    transaction, never what a rollback undid; RECEIVE never returns the copies; the reclaim
    keeps them until the sending side ends the conversation."""
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    rb.send(h, "//t/Request", {"i": 0})
    with rb.transaction() as tx:
        target = tx.receive("Retained", top=1, wait=15)[0].conversation_handle
        tx.send(target, "//t/Reply", {"r": 0})
        tx.savepoint("before")
        tx.send(target, "//t/Reply", {"undone": True})
        tx.rollback_to("before")
    with pytest.raises(RuntimeError):
        with rb.transaction() as tx:
            tx.send(target, "//t/Reply", {"rolled back": True})
            raise RuntimeError("the handler failed")
    rb.send(target, "//t/Reply", {"r": 1})  # outside a transaction: its copy lands with it

    def rows() -> list[tuple[int, str, str, str]]:
        return [
            (r["status"], r["message_type_name"], r["service_name"], r["message_body"])
            for r in rb.queue_messages("Retained", conversation_handle=target)
        ]

    kept = [
        (0, "//t/Request", "//t/Server", '{"i":0}'),
        (3, "//t/Reply", "//t/Server", '{"r":0}'),
        (3, "//t/Reply", "//t/Server", '{"r":1}'),
    ]
    assert rows() == kept
    assert rb.queue_messages("Plain") and all(r["status"] == 1 for r in rb.queue_messages("Plain"))

    # The client gets exactly the two replies, once; the server's queue hands out no copy.
    replies = rb.receive("Plain", wait=15)
    assert [orjson.loads(m.body) for m in replies] == [{"r": 0}, {"r": 1}]
    assert rb.receive("Plain", wait=1) == []
    assert rb.receive("Retained", wait=3) == []  # it consumed both copies, unread
    assert rows() == kept  # consumed, still kept

    topic = names.queue_topic(namespace, "Retained")
    assert topic not in [r.topic for r in reclaim_namespace(kafka_bootstrap, rb.catalog)]
    rb.end_conversation(target)
    assert rows() == []
    assert topic in [r.topic for r in reclaim_namespace(kafka_bootstrap, rb.catalog)]


def test_a_receive_whose_copy_commit_aborts_ends_its_transaction_and_locks_nothing(rb, monkeypatch):
    """RECEIVE consumes a copy in a Kafka transaction of its own; when a rebalance aborts it, the
    RECEIVE raises TransactionAbortedError and its transaction is over, holding nothing: the
    group's messages are received again. (Before, the transaction kept the group's lease, and a
    caller that dropped it, as a reader loop does, left the group locked for ever: the kill -9
    invariant run lost the last message of two conversations so.)"""
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    rb.send(h, "//t/Request", {"i": 0})
    with rb.transaction() as tx:
        target = tx.receive("Retained", top=1, wait=15)[0].conversation_handle
        tx.send(target, "//t/Reply", {"r": 0})  # its copy: in Retained, in the target's group
    rb.send(h, "//t/Request", {"i": 1})  # behind the copy, in the same group
    committer = rb.runtime.committer
    real, failed = committer.commit, []

    def commit(req):
        if not failed:
            failed.append(req)
            raise errors.TransactionAbortedError("fenced: the group rebalanced")
        return real(req)

    monkeypatch.setattr(committer, "commit", commit)
    tx = rb.transaction()
    with pytest.raises(errors.TransactionAbortedError):
        tx.receive("Retained", wait=15)
    assert failed and tx.state.value == "aborted"
    with pytest.raises(errors.TransactionStateError):
        tx.receive("Retained", wait=0)
    assert [orjson.loads(m.body) for m in rb.receive("Retained", wait=15)] == [{"i": 1}]  # not locked


def test_a_foreign_record_typed_as_a_copy_never_reaches_a_reader(kafka_bootstrap, namespace, rb):
    """Another client's record with the copies' message type is consumed unread, as a copy is."""
    topic = names.queue_topic(namespace, "Retained")
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    rb.send(h, "//t/Request", {"i": 0})
    [original] = read_to_end(kafka_bootstrap, topic, 10)
    forged = [(k, RETAINED_MARKER.encode() if k == "kb.message_type_name" else v) for k, v in original.headers()]
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for headers in (forged, [*forged, (H_RETAINED_TYPE, b"//t/Request")], [*forged, (H_RETAINED_TYPE, b"\xff\xfe")]):
        p.produce(topic, key=original.key(), value=b'{"forged":1}', headers=headers, partition=original.partition())
    p.produce(topic, key=original.key(), value=b"x" * 100_000, partition=original.partition())  # no headers at all
    assert p.flush(10) == 0
    rb.send(h, "//t/Request", {"i": 1})
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += [orjson.loads(m.body) for m in rb.receive("Retained", wait=5)]
    assert got == [{"i": 0}, {"i": 1}]
    assert rb.receive("Retained", wait=2) == []
    # The queue view reads them too and lists the two requests, received. The forgeries carry
    # the first request's id, so they are one copy's row at most, and the first of them, which
    # says no sent type, is none.
    rows = rb.queue_messages("Retained")
    assert sorted((r["status"], r["message_body"]) for r in rows) == [(0, '{"i":0}'), (0, '{"i":1}')]


def test_without_retention_received_messages_leave_the_view(rb):
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    rb.send(h, "//t/Request", {"i": 0})
    with rb.transaction() as tx:
        m = tx.receive("Retained", top=1, wait=15)[0]
        tx.send(m.conversation_handle, "//t/Reply", {"ok": True})
    assert statuses(rb.queue_messages("Plain")) == [(0, 1)]
    assert [m.conversation_handle for m in rb.receive("Plain", top=5, wait=15)] == [h]
    assert rb.queue_messages("Plain") == []


def test_cli_queue_messages(kafka_bootstrap, namespace, rb):
    h = rb.begin_dialog("//t/Client", "//t/Server", "//t/RequestReply")
    rb.send(h, "//t/Request", {"i": 0})
    rb.send(h, "//t/Request", {"i": 1})
    rb.receive("Retained", top=1, wait=15)
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap, "KBROKER_NAMESPACE": namespace}
    out = subprocess.run(
        [KBROKER, "queue", "messages", "Retained", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert statuses(rows) == [(0, 0), (1, 1)]
    text = subprocess.run(
        [KBROKER, "queue", "messages", "Retained"],
        env={**env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 0 and "//t/Request" in text.stdout
    bad = subprocess.run([KBROKER, "queue", "messages", "Nope"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Nope" in bad.stderr


def test_unknown_queue_is_typed(rb):
    with pytest.raises(errors.UnknownQueueError):
        rb.queue_messages("Nope")
