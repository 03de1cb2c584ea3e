"""Delayed delivery of the transport face (core/transport/delayed.py, kafka/transport/delayed_store.py)
against the real broker: a delayed send or a send in a handler's transaction reaches its
destination once, when due and not before; a rollback stores nothing; the store's rows survive
a restart of the endpoint; rows past the memory budget are read again and still moved once;
what another client writes to the store is set aside; a row for a queue that is gone goes to
the dead-letter topic."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kbroker.core import names
from kbroker.core.transport.delayed import DelayedDelivery, delayed_topic
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.core.transport.message import TransportMessage
from kbroker.errors import InvalidArgumentError, TransportQueueNotFoundError
from kbroker.sdk.transport.endpoint import TransportEndpoint, send_message
from tests.helpers import wait_for
from tests.integration.test_broker_restart import RestartableBroker, own_broker  # noqa: F401 - a fixture
from tests.integration.test_catalog_apply import run_cli


def drain(ep: TransportEndpoint, seconds: float, *, expect: int | None = None) -> list[tuple[TransportMessage, float]]:
    """Receive from `ep`'s primary queue for `seconds` (or until `expect` messages came): each
    message with the time it was received."""
    got: list[tuple[TransportMessage, float]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (expect is None or len(got) < expect):
        msg = ep.receive(0.5)
        if msg is not None:
            got.append((msg, time.time()))
    return got


def test_a_delayed_send_arrives_once_when_due_and_not_before(endpoints: Callable[..., TransportEndpoint]) -> None:
    billing = endpoints("Billing")
    sales = endpoints("Sales").start(lambda msg, tx: None)
    sent_at = time.time()
    ids = {sales.send("Billing", f"m{i}".encode(), {"n": str(i)}, delay=2.0 + i * 0.5) for i in range(4)}
    at = datetime.now(timezone.utc) + timedelta(seconds=3)
    ids.add(sales.send("Billing", None, {"n": "nb"}, not_before=at))
    got = drain(billing, 15, expect=5)
    assert {m.id for m, _ in got} == ids and len(got) == 5
    by_n = {m.headers["n"]: (m, t) for m, t in got}
    for i in range(4):
        m, t = by_n[str(i)]
        assert m.body == f"m{i}".encode()
        due = sent_at + 2.0 + i * 0.5
        # Moved to Billing once due, not before, and late by at most the interval and a second.
        assert m.enqueued_ms is not None and due * 1000 <= m.enqueued_ms <= due * 1000 + 2000, (i, t)
    nb = by_n["nb"][0]
    assert nb.body is None and nb.enqueued_ms is not None and nb.enqueued_ms >= at.timestamp() * 1000
    assert by_n["0"][0].reply_to_address == sales.settings.reply_address
    assert drain(billing, 2) == []  # and once
    wait_for(lambda: (sales.stats()["delayed"] or {}).get("moved") == 5, 10, "5 rows counted moved")


def test_a_delayed_send_in_a_transaction_is_stored_only_if_it_commits(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    billing = endpoints("Billing")
    sales = endpoints("Sales").start(lambda msg, tx: None)
    with sales.transaction() as tx:
        tx.send("Billing", b"rolled back", delay=0.5)
        tx.rollback()
    with sales.transaction() as tx:
        kept = tx.send("Billing", b"committed", delay=0.5)
    got = drain(billing, 8, expect=1)
    assert [m.id for m, _ in got] == [kept]
    assert drain(billing, 2) == []


def test_a_handler_defers_a_message_to_itself(endpoints: Callable[..., TransportEndpoint]) -> None:
    """A handler that sends itself a message with a delay (a saga timeout's shape)."""
    seen: list[tuple[str, float]] = []

    def handle(msg: TransportMessage, tx: Any) -> None:
        seen.append((msg.headers["step"], time.time()))
        if msg.headers["step"] == "first":
            tx.send("Sales", b"", {"step": "timeout"}, delay=1.5)

    sales = endpoints("Sales").start(handle)
    sales.send("Sales", b"", {"step": "first"})
    wait_for(lambda: len(seen) == 2, 15, "the message and its timeout handled")
    assert [s for s, _ in seen] == ["first", "timeout"]
    assert seen[1][1] - seen[0][1] >= 1.4
    time.sleep(1.5)
    assert len(seen) == 2


def test_rows_wait_for_an_instance_and_survive_a_restart(endpoints: Callable[..., TransportEndpoint]) -> None:
    billing = endpoints("Billing")
    sender = endpoints("Sales", machine="m1")  # never started: its rows wait in the store
    ids = {sender.send("Billing", b"x", delay=0.2) for _ in range(20)}
    assert drain(billing, 2) == []
    first = endpoints("Sales", machine="m2").start(lambda msg, tx: None)
    got = drain(billing, 15, expect=20)
    first.stop()
    assert {m.id for m, _ in got} == ids and len(got) == 20
    endpoints("Sales", machine="m3").start(lambda msg, tx: None)  # reads the store again: all moved
    assert drain(billing, 4) == []


def test_rows_past_the_memory_budget_are_read_again_and_moved_once(endpoints: Callable[..., TransportEndpoint]) -> None:
    billing = endpoints("Billing")
    sender = endpoints("Sales", machine="m1")
    ids = {sender.send("Billing", b"y" * 1000, {"i": str(i)}, delay=0.5 + (i % 10) * 0.2) for i in range(60)}
    tight = DelayedDelivery(batch_size=7, budget=10 * 1500)  # about ten rows at a time
    mover = endpoints("Sales", machine="m2", delayed_delivery=tight).start(lambda msg, tx: None)
    got = drain(billing, 30, expect=60)
    assert sorted(m.id for m, _ in got) == sorted(ids)
    assert drain(billing, 2) == []
    stats = mover.stats()["delayed"]
    assert stats["moved"] == 60 and stats["reads"] >= 3  # read again for the rows dropped


def test_bad_rows_are_set_aside_and_a_missing_queue_dead_letters(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    billing = endpoints("Billing")
    sales = endpoints("Sales")
    store = delayed_topic(namespace, "Sales")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    bad = [
        (b"k1", b"no headers", None),
        (b"k2", b"x", [("Due", b"not a time"), ("Destination", b"Billing")]),
        (b"k3", b"x", [("Due", b"2026-01-01T00:00:00Z"), ("Destination", b"Billing"), ("BodyNull", b"maybe")]),
    ]  # (a record without a key the compacted topic refuses itself)
    for key, value, headers in bad:
        p.produce(store, key=key, value=value, headers=headers)
        assert p.flush(10) == 0
    with pytest.raises(TransportQueueNotFoundError):  # a send to a queue nobody installed fails at once
        sales.send("Nowhere", b"x", delay=0.1)
    gone = endpoints("Gone")
    sales.send("Gone", b"for a queue about to go", delay=1.0)
    good = sales.send("Billing", b"ok", delay=0.1)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    gone.close()
    for f in admin.delete_topics([names.prefix(namespace) + "tqueue.Gone"]).values():
        f.result(30)
    sales.start(lambda msg, tx: None)
    got = drain(billing, 90, expect=1)  # after the row for Gone, which fails until it is found out
    assert [m.id for m, _ in got] == [good]
    wait_for(lambda: sales.stats()["delayed"]["rejected"] == 3, 30, "3 bad rows set aside", seen=sales.stats)
    wait_for(lambda: sales.stats()["delayed"]["dead_lettered"] == 1, 90, "1 row dead-lettered", seen=sales.stats)
    c = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed"}
    )
    dead = names.deadletter_topic(namespace)
    parts = c.list_topics(dead, timeout=10).topics[dead].partitions
    c.assign([TopicPartition(dead, p, OFFSET_BEGINNING) for p in parts])
    reasons = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("'Gone'" in r for r in reasons):
        m = c.poll(0.5)
        if m is not None and not m.error():
            reasons.append(dict(m.headers() or []).get("kb.dlq.reason", b"").decode())
    c.close()
    assert any("'Gone'" in r for r in reasons), reasons


def test_send_only_endpoints_and_bad_times_are_refused(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    endpoints("Billing")
    sender = endpoints("Client", send_only=True, install=False)
    with pytest.raises(InvalidArgumentError, match="send-only"):
        sender.send("Billing", b"x", delay=1)
    with pytest.raises(InvalidArgumentError, match="send-only"):
        sender.start(lambda msg, tx: None)
    with pytest.raises(InvalidArgumentError, match="not both"):
        sender.send("Billing", b"x", delay=1, not_before=time.time(), delayed_store="Billing")
    with pytest.raises(InvalidArgumentError, match="delay must be"):
        sender.send("Billing", b"x", delay=-1, delayed_store="Billing")
    # the CLI's path: a send-only client stores the row in the destination's own store
    mid = send_message(kafka_bootstrap, namespace, "Billing", b"later", delay=0.3)
    billing = endpoints("Billing", machine="m2").start(lambda msg, tx: None)
    wait_for(lambda: (billing.stats()["delayed"] or {}).get("moved") == 1, 15, "the CLI's row moved")
    assert mid


def test_the_cli_sends_a_delayed_message_and_refuses_bad_options(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    billing = endpoints("Billing")
    ok = run_cli(
        kafka_bootstrap,
        "endpoint",
        "send",
        "Billing",
        "--body",
        "later",
        "--delay",
        "1",
        "--json",
        "--namespace",
        namespace,
    )
    assert ok.returncode == 0, ok.stderr
    sent = orjson.loads(ok.stdout)
    assert sent["queue"] == "Billing" and sent["delay"] == 1.0
    at = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
    second = run_cli(
        kafka_bootstrap, "endpoint", "send", "Billing", "--body", "at", "--not-before", at, "--namespace", namespace
    )
    assert second.returncode == 0, second.stderr
    assert billing.receive(0.5) is None  # waiting in Billing's store
    seen: list[str] = []
    billing.start(lambda msg, tx: seen.append(msg.id))  # its mover moves them, its readers take them
    wait_for(lambda: len(seen) == 2, 15, "both delayed sends handled", seen=lambda: seen)
    assert sorted(seen) == sorted([sent["Id"], second.stdout.strip()])
    both = run_cli(
        kafka_bootstrap, "endpoint", "send", "Billing", "--delay", "1", "--not-before", at, "--namespace", namespace
    )
    assert (both.returncode, both.stderr) == (1, "kbroker: error: give --delay or --not-before, not both\n")
    bad = run_cli(kafka_bootstrap, "endpoint", "send", "Billing", "--not-before", "soon", "--namespace", namespace)
    assert bad.returncode == 1 and bad.stderr.splitlines() == [
        "kbroker: error: not_before 'soon' is not an ISO 8601 time"
    ]
    store = run_cli(kafka_bootstrap, "endpoint", "send", "Billing", "--store", "Sales", "--namespace", namespace)
    assert store.returncode == 1 and "--store is for a delayed send" in store.stderr


@pytest.mark.kafka_cluster  # a broker stopped and started: a long run (`make test-long`)
@pytest.mark.timeout(300)
def test_rows_are_moved_once_through_a_broker_restart(own_broker: RestartableBroker, namespace: str) -> None:
    """200 rows due over 8 s; the broker stops for 5 s in the middle and starts again on the same
    ports. The mover, never restarted, rides through: Billing's topic (read_committed) then holds
    each message exactly once, and the store's mover has moved all 200."""
    bootstrap = own_broker.bootstrap
    billing = TransportEndpoint("Billing", cluster=bootstrap, namespace=namespace, install=True)
    sales = TransportEndpoint("Sales", cluster=bootstrap, namespace=namespace, install=True)
    try:
        with sales.transaction() as tx:
            ids = {tx.send("Billing", str(i).encode(), delay=1.0 + i * 0.04) for i in range(200)}
        sales.start(lambda msg, tx: None)
        time.sleep(4.0)
        own_broker.restart(5.0)
        topic = transport_queue_topic(namespace, "Billing")
        c = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed"}
        )
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
        got: list[str] = []
        deadline = time.monotonic() + 150
        while len(got) < 200 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(dict(m.headers() or [])["Id"].decode())
        time.sleep(3.0)  # and nothing after
        while (m := c.poll(0.5)) is not None:
            if m.error() is None:
                got.append(dict(m.headers() or [])["Id"].decode())
        c.close()
        counts = Counter(got)
        assert set(counts) == ids, f"lost {len(ids - set(counts))}; the mover: {sales.stats()['delayed']}"
        assert max(counts.values()) == 1, f"duplicated {[i for i, n in counts.items() if n > 1][:5]}"
        wait_for(lambda: sales.stats()["delayed"]["moved"] == 200, 30, "200 rows counted moved", seen=sales.stats)
    finally:
        sales.close()
        billing.close()
