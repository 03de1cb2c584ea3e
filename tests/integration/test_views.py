"""Queue status (ALTER QUEUE ... STATUS) and the views, against the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import time

import orjson
import pytest
from confluent_kafka import Producer

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import SEQUENCE_BLOCK
from kbroker.kafka import queue_views
from kbroker.kafka.queue_views import conversation_view, queue_view, set_queue_status
from kbroker.kafka.receive.retention import queue_messages
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import KBROKER


def send_three(broker: Broker) -> str:
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(3):
        broker.send(h, CLAIM, {"claim": i})
    return h


def events(bootstrap: str, namespace: str) -> list[tuple[str, dict]]:
    """Every record of the events topic, read to partition EOF."""
    records = read_to_end(bootstrap, names.events_topic(namespace), 20, must_finish=True)
    return [(m.key().decode(), orjson.loads(m.value())) for m in records]


def test_queue_view_counts_ready_messages(kafka_bootstrap, namespace, broker):
    send_three(broker)
    view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")
    assert view["queue"] == "ExpenseQueue" and view["topic"] == names.queue_topic(namespace, "ExpenseQueue")
    assert view["status"] == "ON" and view["poison_message_handling"] == "ON"
    assert view["partitions"] == len(view["partition_offsets"]) == 4
    assert view["totals"]["ready"] == 3 and view["totals"]["end"] == 3
    assert all(p["committed"] is None for p in view["partition_offsets"])
    assert view["group"]["members"] == 0

    assert len(broker.receive("ExpenseQueue", top=10, wait=15)) == 3
    view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")
    assert view["totals"]["ready"] == 0
    busy = [p for p in view["partition_offsets"] if p["end"]]
    assert len(busy) == 1 and busy[0]["committed"] == 3  # one conversation group, one partition
    assert view["group"]["members"] == 1  # the Broker's reader stays in the group until close


def test_queue_show_counts_ready_messages_not_transaction_markers(kafka_bootstrap, namespace, broker, monkeypatch):
    """Each committed transaction leaves a marker taking an offset; a new user saw `ready 14`
    where `queue messages` listed 11. Up to EXACT_READY records the view counts; past it the
    column says its figure is an upper bound."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(4):
        with broker.transaction() as tx:
            tx.send(h, CLAIM, {"claim": i})
    tx = broker.transaction()
    tx.send(h, CLAIM, {"claim": "rolled back"})
    tx.rollback()
    view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")
    assert view["totals"]["end"] >= 8  # four messages and four commit markers at least
    assert (view["totals"]["ready"], view["totals"]["ready_exact"]) == (4, True)
    assert sum(p["ready"] for p in view["partition_offsets"]) == 4
    listed = [r for r in queue_messages(kafka_bootstrap, namespace, "ExpenseQueue") if r["status"] == 1]
    assert len(listed) == 4
    kw = dict(bootstrap=kafka_bootstrap, namespace=namespace)
    out = run_cli("queue", "show", "ExpenseQueue", **kw)
    assert out.returncode == 0 and "ready" in out.stdout and "at most" not in out.stdout, out.stderr

    assert len(broker.receive("ExpenseQueue", top=1, wait=15)) == 1
    assert queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["totals"]["ready"] == 3

    monkeypatch.setattr(queue_views, "EXACT_READY", 2)  # too many to read: the bound, labelled
    view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")
    assert view["totals"]["ready_exact"] is False and view["totals"]["ready"] > 3


def test_queue_show_counts_only_messages_among_records_another_client_wrote(kafka_bootstrap, namespace, broker):
    """The count reads the queue's records (ready_counted): garbage, a record without headers,
    bad header values, a 200 KB body and records forged with the never-delivered types are not
    ready messages; the real ones around them are counted and received once, in order."""
    topic = names.queue_topic(namespace, "ExpenseQueue")
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"claim": 0})
    [original] = read_to_end(kafka_bootstrap, topic, 10)
    headers = original.headers()

    def typed(name: bytes) -> list:
        return [(k, name if k == "kb.message_type_name" else v) for k, v in headers]

    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for value, hs in (
        (b"\xff\x00 not a message", None),
        (b"x" * 200_000, None),
        (b"{}", [(k, b"\xff\xfe" if k == "kb.message_type_name" else v) for k, v in headers]),
        (b"{}", [(k, v) for k, v in headers if k != "kb.conversation_group_id"]),
        (b"{}", typed(b"urn:kbroker:MoveConversation")),
        (b"{}", typed(b"urn:kbroker:RetainedSent")),
    ):
        p.produce(topic, key=original.key(), value=value, headers=hs, partition=original.partition())
    assert p.flush(10) == 0
    broker.send(h, CLAIM, {"claim": 1})
    view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")
    assert (view["totals"]["ready"], view["totals"]["ready_exact"]) == (2, True)
    assert view["totals"]["end"] >= 8
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += [orjson.loads(m.body) for m in broker.receive("ExpenseQueue", wait=5)]
    assert got == [{"claim": 0}, {"claim": 1}]
    assert queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["totals"]["ready"] == 0


def test_queue_view_shows_locked_groups_and_messages_in_flight_across_processes(kafka_bootstrap, namespace, broker):
    send_three(broker)
    tx = broker.transaction()
    assert len(tx.receive("ExpenseQueue", top=10, wait=15)) == 3  # held: the transaction stays open
    try:
        deadline, view = time.time() + 15, None
        while time.time() < deadline:
            view = queue_view(kafka_bootstrap, namespace, "ExpenseQueue")  # as another process sees it
            if view["locked_groups"]:
                break
            time.sleep(0.5)
        assert view["locked_groups"] == 1 and view["in_flight"] == 3, view["readers"]
        [reader] = view["readers"]
        assert reader["locked_groups"] == 1 and reader["in_flight"] == 3 and len(reader["partitions"]) == 4
    finally:
        tx.rollback()
    deadline = time.time() + 15
    while time.time() < deadline and queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["locked_groups"]:
        time.sleep(0.5)
    assert queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["locked_groups"] == 0
    broker.close()  # a process that stops reading leaves the view at once
    assert queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["readers"] == []


def test_views_on_unknown_queue_are_typed(kafka_bootstrap, namespace, broker):
    with pytest.raises(errors.UnknownQueueError):
        queue_view(kafka_bootstrap, namespace, "NoSuchQueue")
    with pytest.raises(errors.UnknownQueueError):
        set_queue_status(kafka_bootstrap, namespace, "NoSuchQueue", "OFF", "test")
    with pytest.raises(ValueError, match="ON or OFF"):
        set_queue_status(kafka_bootstrap, namespace, "ExpenseQueue", "MAYBE", "test")


def test_disable_and_enable_queue(kafka_bootstrap, namespace, broker):
    send_three(broker)  # this Broker only sends: a reader that stops polling would stall a rebalance
    set_queue_status(kafka_bootstrap, namespace, "ExpenseQueue", "OFF", "maintenance")
    assert queue_view(kafka_bootstrap, namespace, "ExpenseQueue")["status"] == "OFF"
    with Broker(kafka_bootstrap, namespace) as other:
        with pytest.raises(errors.QueueDisabledError, match="ExpenseQueue"):
            other.receive("ExpenseQueue", top=10, wait=0)
    set_queue_status(kafka_bootstrap, namespace, "ExpenseQueue", "ON", "done", poison=False)

    got = events(kafka_bootstrap, namespace)
    assert [(k, e["event"], e["reason"], e["poison"]) for k, e in got] == [
        ("ExpenseQueue", "QUEUE_DISABLED", "maintenance", False),
        ("ExpenseQueue", "QUEUE_ENABLED", "done", False),
    ]  # same key, same partition: in order
    assert all(e["queue"] == "ExpenseQueue" and abs(e["time"] / 1000 - time.time()) < 120 for _, e in got)

    with Broker(kafka_bootstrap, namespace) as other:
        assert len(other.receive("ExpenseQueue", top=10, wait=15)) == 3


def test_conversation_view_lists_both_endpoints(kafka_bootstrap, namespace, broker):
    h = send_three(broker)
    rows = conversation_view(kafka_bootstrap, namespace)
    # Written at the first SEND, with the block of sequence numbers it reserved.
    assert [(r["conversation_handle"], r["state"], r["send_sequence"], r["sequence_reserved"]) for r in rows] == [
        (h, "CO", 1, 1 + SEQUENCE_BLOCK)
    ]
    target = broker.receive("ExpenseQueue", top=10, wait=15)[0].conversation_handle
    rows = conversation_view(kafka_bootstrap, namespace)
    assert [r["conversation_handle"] for r in rows] == [h, target]  # initiator first
    ini, tgt = rows
    assert ini["is_initiator"] and not tgt["is_initiator"]
    assert ini["conversation_id"] == tgt["conversation_id"]
    assert (ini["service_name"], ini["far_service"]) == (EMP, EXP)
    assert (tgt["service_name"], tgt["far_service"]) == (EXP, EMP)
    assert tgt["state"] == "CO" and tgt["state_desc"] == "CONVERSING" and tgt["send_sequence"] == 0
    assert all(r["service_contract_name"] == CONTRACT and r["lifetime"] is None for r in rows)  # never expires


def run_cli(*args, bootstrap, namespace):
    env = {**os.environ, "KBROKER_BOOTSTRAP": bootstrap, "KBROKER_NAMESPACE": namespace}
    return subprocess.run([KBROKER, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_views(kafka_bootstrap, namespace, broker):
    kw = dict(bootstrap=kafka_bootstrap, namespace=namespace)
    h = send_three(broker)

    out = run_cli("queue", "show", "ExpenseQueue", "--json", **kw)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["totals"]["ready"] == 3
    out = run_cli("queue", "show", "ExpenseQueue", **kw)
    assert out.returncode == 0 and "ExpenseQueue" in out.stdout, out.stderr

    out = run_cli("queue", "disable", "ExpenseQueue", "--reason", "cli test", "--json", **kw)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"queue": "ExpenseQueue", "status": "OFF", "reason": "cli test"}
    out = run_cli("receive", "ExpenseQueue", **kw)
    assert out.returncode == 1 and "disabled" in out.stderr
    out = run_cli("queue", "enable", "ExpenseQueue", **kw)
    assert out.returncode == 0 and "enabled" in out.stdout, out.stderr
    assert [e["event"] for _, e in events(kafka_bootstrap, namespace)] == ["QUEUE_DISABLED", "QUEUE_ENABLED"]

    out = run_cli("conversations", "--json", **kw)
    assert out.returncode == 0, out.stderr
    assert [r["conversation_handle"] for r in json.loads(out.stdout)] == [h]
    out = run_cli("conversations", "--json", "--state", "DO", **kw)
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stderr
    out = run_cli("conversations", **kw)
    assert out.returncode == 0 and "CO" in out.stdout, out.stderr


@pytest.mark.parametrize("args", [["queue", "show", "NoSuchQueue"], ["queue", "disable", "NoSuchQueue"]])
def test_cli_unknown_queue_is_one_line(kafka_bootstrap, namespace, broker, args):
    out = run_cli(*args, bootstrap=kafka_bootstrap, namespace=namespace)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown queue 'NoSuchQueue'" in lines[0], out.stderr


def test_alter_queue_changes_retention_poison_handling_and_drops_the_activation(kafka_bootstrap, namespace, broker):
    """ALTER QUEUE ... WITH RETENTION, POISON_MESSAGE_HANDLING and ACTIVATION (DROP) without a
    definition file: the published queue changes and every process reads it."""
    kw = dict(bootstrap=kafka_bootstrap, namespace=namespace)
    before = broker.refresh_catalog().queue("ExpenseQueue")
    assert (before.retention, before.poison_message_handling, before.activation is not None) == ("OFF", "ON", True)
    out = run_cli(
        "queue", "alter", "ExpenseQueue", "--retention", "on", "--poison-message-handling", "off", "--json", **kw
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["retention"] == "ON"
    after = broker.refresh_catalog().queue("ExpenseQueue")
    assert (after.retention, after.poison_message_handling) == ("ON", "OFF")
    assert after.activation == before.activation and after.partitions == before.partitions  # the rest stays
    out = run_cli("queue", "alter", "ExpenseQueue", "--activation", "drop", "--json", **kw)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["activation"] is None
    assert broker.refresh_catalog().queue("ExpenseQueue").activation is None
    out = run_cli("queue", "alter", "ExpenseQueue", "--activation", "drop", "--max-readers", "2", **kw)
    assert out.returncode != 0 and "takes no --max-readers" in out.stderr
    out = run_cli("queue", "alter", "NoSuchQueue", "--retention", "on", **kw)
    assert out.returncode != 0 and "NoSuchQueue" in out.stderr and "Traceback" not in out.stderr
