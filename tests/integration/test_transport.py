"""The transport face (NServiceBus's SQL Server transport model) against the real broker: the
columns on the wire, Expires, rollback and poison messages, callbacks to the sending instance,
the three concurrency models (threads and asyncio), interop with plain Kafka clients, and a
send to a queue nobody installed."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY

from kbroker import transport
from kbroker.core import names
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.core.transport.message import ENCLOSED_MESSAGE_TYPES, MESSAGE_ID, REPLY_TO_ADDRESS, TransportMessage
from kbroker.errors import TransportQueueNotFoundError
from kbroker.sdk.transport.endpoint import TransportEndpoint
from tests.helpers import wait_for

NSB_HEADERS = {
    ENCLOSED_MESSAGE_TYPES: "Sales.Messages.OrderPlaced, Sales.Messages",
    MESSAGE_ID: "m-1",
    REPLY_TO_ADDRESS: "Sales",
    "NServiceBus.ContentType": "application/json",
    "Ünïcode": "✓",
}


@contextmanager
def reader(bootstrap: str, topic: str) -> Iterator[Consumer]:
    """A plain read_committed consumer assigned every partition of `topic` from the beginning."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        assert meta.error is None, meta.error
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        yield c
    finally:
        c.close()


def drain(c: Consumer, *, until: int | None = None, timeout: float = 10.0, quiet: float = 1.0) -> list[Any]:
    """Every record `c` gets: until `until` records came (then `quiet` s more, to see any extra),
    or `timeout` s passed."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rec in c.consume(100, 0.2):
            if rec.error() is None:
                got.append(rec)
        if until is not None and len(got) >= until:
            deadline = min(deadline, time.monotonic() + quiet)
            until = None
    return got


def hdrs(rec: Any) -> dict[str, bytes]:
    return dict(rec.headers() or [])


def plain_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap})


# --- columns ---------------------------------------------------------------------------------------


def test_every_column_round_trips_through_send_and_receive(endpoints):
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2")
    given_id = str(uuid.uuid4())
    before = int(time.time() * 1000)
    mid = a.send(
        "Billing",
        b"\x00\x01\xfe\xffbinary",
        NSB_HEADERS,
        message_id=given_id.upper(),
        correlation_id="corr-1",
        reply_to_address="Sales.elsewhere",
        recoverable=True,
        time_to_be_received=600,
    )
    assert mid == given_id  # canonical form
    express = a.send("Billing", None, {ENCLOSED_MESSAGE_TYPES: "Ping"}, recoverable=False)
    assert a._express is not None  # Recoverable = false took the express producer
    got: dict[str, TransportMessage] = {}
    for _ in range(2):
        m = b.receive(wait=15)
        assert m is not None, f"only {list(got)} came"
        got[m.id] = m
    assert set(got) == {given_id, express}
    m = got[given_id]
    assert m.body == b"\x00\x01\xfe\xffbinary"
    assert dict(m.headers) == NSB_HEADERS
    assert (m.correlation_id, m.reply_to_address, m.recoverable) == ("corr-1", "Sales.elsewhere", True)
    assert m.expires is not None and before + 600_000 <= m.expires <= int(time.time() * 1000) + 600_000
    assert m.queue == "Billing" and 0 <= m.partition < 4 and m.row_version >= 0
    assert m.enqueued_ms is not None and before - 1000 <= m.enqueued_ms <= int(time.time() * 1000) + 1000
    e = got[express]
    assert e.body is None and e.recoverable is False and e.expires is None and e.correlation_id is None
    assert e.reply_to_address == "Sales.m1"  # defaults to the sender's secondary queue
    assert e.row_version >= 0 and 0 <= e.partition < 4
    assert b.receive(wait=1) is None  # each taken once


def test_empty_body_is_not_null(endpoints):
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2")
    mid = a.send("Billing", b"")
    m = b.receive(wait=15)
    assert m is not None and m.id == mid and m.body == b""


def test_receive_without_waiting_sees_what_the_queue_already_holds(endpoints):
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2")
    mid = a.send("Billing", b"waiting already")
    m = b.receive(wait=0)  # a fresh consumer: RECEIVE waits once for the queue's first fetch
    assert m is not None and m.id == mid
    assert b.receive(wait=0) is None


def test_without_a_secondary_queue_replies_come_to_the_primary(endpoints, kafka_bootstrap, namespace):
    from confluent_kafka.admin import AdminClient

    server = endpoints("Server", machine="s1")
    server.start(lambda msg, tx: tx.reply(msg, b"pong"))
    client = endpoints("Client", machine="c1", secondary=False)
    assert (
        transport_queue_topic(namespace, "Client.c1")
        not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    )
    handled: list[TransportMessage] = []
    client.start(lambda msg, tx: handled.append(msg))
    rid = str(uuid.uuid4())
    reply = client.request("Server", b"ping", message_id=rid).result(20)
    assert (reply.correlation_id, reply.body, reply.queue) == (rid, b"pong", "Client")
    assert handled == []


# --- Expires -----------------------------------------------------------------------------------------


def test_an_expired_message_is_never_handed_out(endpoints):
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2")
    stale = a.send("Billing", b"stale", time_to_be_received=1)
    time.sleep(1.6)
    live = a.send("Billing", b"live", time_to_be_received=60)
    m = b.receive(wait=15)
    assert m is not None and m.id == live and m.id != stale
    assert b.receive(wait=2) is None
    assert b.runtime.counters["expired"] == 1
    # Removed for good: a new instance of the endpoint does not get it either.
    with transport.endpoint("Billing", bootstrap=b.bootstrap, namespace=b.namespace, machine="m3") as b2:
        assert b2.receive(wait=3) is None


# --- rollback -----------------------------------------------------------------------------------------


def test_a_failed_handler_rolls_back_its_receive_and_its_sends(endpoints, kafka_bootstrap, namespace):
    a, b, _c = endpoints("Sales"), endpoints("Billing", machine="m2"), endpoints("Shipping", machine="m3")
    mid = a.send("Billing", b"order-1")
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="handler failed"):
        with b.transaction() as tx:
            m = tx.receive(wait=15)
            assert m is not None
            seen.append(m.id)
            tx.send("Shipping", b"ship-rolled-back")
            raise RuntimeError("handler failed")
    assert tx.state == "rolled back"
    assert b.runtime.counters["rolled_back"] == 1
    with reader(kafka_bootstrap, transport_queue_topic(namespace, "Shipping")) as shipping:
        assert drain(shipping, timeout=2.0) == []  # nothing of the rolled-back send
        with b.transaction() as tx:
            m = tx.receive(wait=15)
            assert m is not None
            seen.append(m.id)
            tx.send("Shipping", b"ship-committed", correlation_id=m.id)
        assert tx.state == "committed"
        assert seen == [mid, mid]  # the same message, again
        recs = drain(shipping, until=1, timeout=10.0, quiet=2.0)
        assert [r.value() for r in recs] == [b"ship-committed"]  # exactly once
        assert hdrs(recs[0])["CorrelationId"] == mid.encode()
    assert b.receive(wait=2) is None  # its removal committed with the send


# --- poison messages -----------------------------------------------------------------------------------


def test_a_poison_message_goes_to_the_dead_letter_topic(endpoints, kafka_bootstrap, namespace):
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2", max_deliveries=2, recoverability=None)
    attempts: Counter[str] = Counter()
    handled: list[bytes | None] = []
    lock = threading.Lock()

    def handler(msg: TransportMessage, tx: Any) -> None:
        with lock:
            attempts[msg.id] += 1
        if msg.body == b"poison":
            raise RuntimeError("cannot digest this")
        with lock:
            handled.append(msg.body)

    with reader(kafka_bootstrap, names.deadletter_topic(namespace)) as dlq:
        poison = a.send("Billing", b"poison")
        b.start(handler)
        good = a.send("Billing", b"good")
        recs = drain(dlq, until=1, timeout=20.0, quiet=1.0)
        wait_for(lambda: handled, 15, "the message after the poison one")
    assert handled == [b"good"]
    assert attempts == {poison: 2, good: 1}  # max_deliveries, then not handed out again
    assert len(recs) == 1 and recs[0].value() == b"poison"
    h = hdrs(recs[0])
    assert h["Id"] == poison.encode()
    reason = h["kb.dlq.reason"].decode()
    assert "failed 2 times" in reason and "cannot digest this" in reason
    assert h["kb.dlq.topic"] == transport_queue_topic(namespace, "Billing").encode()
    assert b.runtime.counters["dead_lettered"] == 1
    assert (
        REGISTRY.get_sample_value(
            "kbroker_dead_letters_total",
            {"namespace": namespace, "queue": "Billing", "reason": "poison", "kept": "copy"},
        )
        == 1
    )
    time.sleep(1.5)
    assert attempts[poison] == 2  # gone from the queue


def test_a_message_whose_transaction_never_commits_is_dead_lettered(endpoints, kafka_bootstrap, namespace):
    # A send over the queue's limit (transport_queues.MAX_BODY_BYTES) is refused by tx.send, so the
    # handler fails, rolls back and counts, instead of a commit that aborts every time.
    a, b = endpoints("Sales"), endpoints("Billing", machine="m2", max_deliveries=2, recoverability=None)
    endpoints("Shipping", machine="m3")
    calls: Counter[str] = Counter()

    def handler(msg: TransportMessage, tx: Any) -> None:
        calls[msg.id] += 1
        tx.send("Shipping", b"x" * (12 * 1024 * 1024))

    with reader(kafka_bootstrap, names.deadletter_topic(namespace)) as dlq:
        mid = a.send("Billing", b"asks for too much")
        b.start(handler)
        recs = drain(dlq, until=1, timeout=10.0, quiet=0.5)
        b.stop()
    assert [hdrs(r)["Id"] for r in recs] == [mid.encode()]
    assert calls[mid] <= 2


# --- callbacks ------------------------------------------------------------------------------------------


def test_callbacks_reach_the_sending_instance_only(endpoints):
    server = endpoints("Server", machine="s1")
    server.start(lambda msg, tx: tx.reply(msg, b"re:" + (msg.body or b"")))
    c1, c2 = endpoints("Client", machine="c1"), endpoints("Client", machine="c2")
    handled: dict[str, list[TransportMessage]] = {"c1": [], "c2": []}
    c1.start(lambda msg, tx: handled["c1"].append(msg))
    c2.start(lambda msg, tx: handled["c2"].append(msg))
    requests = {}
    futures = {}
    for name, client in (("c1", c1), ("c2", c2)):
        for i in range(3):
            rid = str(uuid.uuid4())
            futures[rid] = (name, client.request("Server", f"{name}-{i}".encode(), message_id=rid))
            requests[rid] = f"re:{name}-{i}".encode()
    for rid, (name, f) in futures.items():
        reply = f.result(20)
        assert reply.correlation_id == rid
        assert reply.body == requests[rid]
        assert reply.queue == f"Client.{name}"  # the instance's secondary queue
    time.sleep(1.0)
    assert handled == {"c1": [], "c2": []}  # no reply reached a handler, neither the other instance's


# --- concurrency models ---------------------------------------------------------------------------------


class InFlight:
    """A handler that sleeps and records how many handlers ran at once and what each handled."""

    def __init__(self, pause: float):
        self.pause = pause
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.ids: Counter[str] = Counter()
        self.threads: set[str] = set()

    def __call__(self, msg: TransportMessage, tx: Any) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)
        try:
            time.sleep(self.pause)
        finally:
            with self.lock:
                self.now -= 1
                self.ids[msg.id] += 1


def push(ep: TransportEndpoint, queue: str, n: int) -> set[str]:
    """n messages to `queue`, in one transaction."""
    with ep.transaction() as tx:
        return {tx.send(queue, f"m{i}".encode()) for i in range(n)}


def primary_stats(ep: TransportEndpoint) -> dict[str, Any]:
    return ep.stats()["readers"][0]


def run_model(
    endpoints: Any, concurrency: str, max_concurrency: int, n: int, delay: float
) -> tuple[TransportEndpoint, InFlight, dict[str, Any]]:
    """`n` messages through an endpoint of `concurrency`, a handler taking `delay` s; asserts
    each was handled once and returns the endpoint, the handler and the primary readers' stats."""
    sender = endpoints("Sales")
    worker = endpoints("Worker", machine="w1", concurrency=concurrency, max_concurrency=max_concurrency)
    sent = push(sender, "Worker", n)
    h = InFlight(delay)
    worker.start(h)
    wait_for(lambda: len(h.ids) >= n, 30, f"{n} messages handled")
    time.sleep(0.5)  # time for a duplicate to show
    assert set(h.ids) == sent and set(h.ids.values()) == {1}
    return worker, h, primary_stats(worker)


def test_monitor_model_never_exceeds_max_concurrency(endpoints):
    worker, h, st = run_model(endpoints, "3.0", 4, 200, 0.02)
    assert st["model"] == "monitor" and st["queue"] == "Worker"
    assert 2 <= h.most <= 4
    assert st["peak"] <= 4
    # Idle: no receive task left, the monitoring loop is the only one waiting.
    wait_for(lambda: primary_stats(worker)["readers"] == 0, 5, "the receive tasks to end")
    assert worker.runtime.counters["received"] == 200


def test_async_monitor_model_never_exceeds_max_concurrency(kafka_bootstrap, namespace, endpoints):
    sender = endpoints("Sales")
    endpoints("Worker", machine="w1")  # the installer's run; never started, so it reads nothing
    sent = push(sender, "Worker", 200)

    async def main() -> tuple[int, Counter[str], dict[str, Any], int]:
        ep = await transport.async_endpoint(
            "Worker",
            bootstrap=kafka_bootstrap,
            namespace=namespace,
            machine="w1",
            concurrency="monitor",
            max_concurrency=4,
        )
        now = most = 0
        ids: Counter[str] = Counter()

        async def handle(msg: TransportMessage, tx: Any) -> None:
            nonlocal now, most
            now += 1
            most = max(most, now)
            try:
                await asyncio.sleep(0.02)
            finally:
                now -= 1
                ids[msg.id] += 1

        try:
            await ep.start(handle)
            deadline = time.monotonic() + 30
            while len(ids) < len(sent) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            stats = ep.stats()
            idle_deadline = time.monotonic() + 5
            while ep.running["Worker"] and time.monotonic() < idle_deadline:
                await asyncio.sleep(0.1)
            return most, ids, stats, ep.running["Worker"]
        finally:
            await ep.close()

    most, ids, stats, running_after = asyncio.run(main())
    assert set(ids) == sent and set(ids.values()) == {1}
    assert 2 <= most <= 4
    assert stats["peak"]["Worker"] <= 4
    assert running_after == 0


def run_async_poison(bootstrap: str, namespace: str, sender: TransportEndpoint) -> dict[str, Any]:
    """An asyncio 3.0 endpoint `Worker` (max_deliveries=2, recoverability=None) handling a poison message then a good
    one; what it handled, and on which threads the poison message was dead-lettered."""
    poison = sender.send("Worker", b"poison")

    async def main() -> dict[str, Any]:
        ep = await transport.async_endpoint(
            "Worker",
            bootstrap=bootstrap,
            namespace=namespace,
            machine="w1",
            concurrency="monitor",
            max_concurrency=4,
            max_deliveries=2,
            recoverability=None,
        )
        attempts: Counter[bytes | None] = Counter()
        dead_lettered_on: list[int] = []
        dead_letter = ep.sync.runtime.dead_letter_poison

        def spy(*args: Any, **kw: Any) -> None:  # records the thread the (blocking) commit ran on
            dead_lettered_on.append(threading.get_ident())
            dead_letter(*args, **kw)

        ep.sync.runtime.dead_letter_poison = spy  # type: ignore[method-assign]

        async def handle(msg: TransportMessage, tx: Any) -> None:
            attempts[msg.body] += 1
            if msg.body == b"poison":
                raise RuntimeError("cannot digest this")
            await tx.send("Sales", b"handled " + (msg.body or b""))

        try:
            await ep.start(handle)
            good = await ep.send("Worker", b"good")
            deadline = time.monotonic() + 20
            while (
                not attempts[b"good"] or not ep.sync.runtime.counters["dead_lettered"]
            ) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            return {
                "attempts": dict(attempts),
                "on": dead_lettered_on,
                "loop": threading.get_ident(),
                "counters": dict(ep.sync.runtime.counters),
                "ids": (poison, good),
            }
        finally:
            await ep.close()

    return asyncio.run(main())


def test_async_poison_message_goes_to_the_dead_letter_topic(endpoints, kafka_bootstrap, namespace):
    sender = endpoints("Sales")
    endpoints("Worker", machine="w1")  # installs Worker; never started
    with reader(kafka_bootstrap, names.deadletter_topic(namespace)) as dlq:
        got = run_async_poison(kafka_bootstrap, namespace, sender)
        recs = drain(dlq, until=1, timeout=10.0, quiet=0.5)
    assert got["attempts"] == {b"poison": 2, b"good": 1}
    assert got["counters"]["dead_lettered"] == 1
    assert [hdrs(r)["Id"] for r in recs] == [got["ids"][0].encode()]
    assert "failed 2 times" in hdrs(recs[0])["kb.dlq.reason"].decode()
    assert sender.receive(wait=10) is not None  # the good message's handler's send committed


def test_async_dead_lettering_does_not_block_the_event_loop(endpoints, kafka_bootstrap, namespace):
    # A 3.0 receive task takes its message off the loop: a poison one is dead-lettered there,
    # a Kafka transaction the loop must not wait for.
    sender = endpoints("Sales")
    endpoints("Worker", machine="w1")
    got = run_async_poison(kafka_bootstrap, namespace, sender)
    assert len(got["on"]) == 1
    assert got["on"][0] != got["loop"]


def test_ramp_model_grows_under_load_and_shrinks_to_one_when_idle(endpoints):
    worker, h, st = run_model(endpoints, "2.1", 4, 200, 0.01)
    assert st["model"] == "ramp"
    assert 1 < st["peak"] <= 4 and h.most <= 4
    assert h.most > 1
    wait_for(lambda: primary_stats(worker)["readers"] == 1, 15, "the readers to shrink back to one")
    time.sleep(2.0)
    assert primary_stats(worker)["readers"] == 1  # never fewer than one


def test_fixed_model_runs_n_readers(endpoints):
    worker, h, st = run_model(endpoints, "pre-2.0", 3, 60, 0.02)
    assert st["model"] == "fixed" and st["readers"] == 3
    assert h.most <= 3
    assert len(h.threads) == 3  # every reader took part
    time.sleep(1.5)
    assert primary_stats(worker)["readers"] == 3  # idle too


# --- interop with plain Kafka clients -------------------------------------------------------------------


def test_a_plain_consumer_reads_a_transport_message(endpoints, kafka_bootstrap, namespace):
    a, _b = endpoints("Sales"), endpoints("Billing", machine="m2")
    mid = a.send("Billing", b'{"order": 1}', NSB_HEADERS, correlation_id="corr-9", time_to_be_received=600)
    with reader(kafka_bootstrap, transport_queue_topic(namespace, "Billing")) as c:
        recs = drain(c, until=1)
    assert len(recs) == 1
    rec = recs[0]
    assert rec.key() == mid.encode() and rec.value() == b'{"order": 1}'
    h = hdrs(rec)
    assert h["Id"] == mid.encode() and h["Recoverable"] == b"true" and h["CorrelationId"] == b"corr-9"
    assert h["ReplyToAddress"] == b"Sales.m1"
    assert orjson.loads(h["Headers"]) == NSB_HEADERS
    assert h["Expires"].decode().endswith("Z")


def test_a_plain_producers_record_is_a_transport_message(endpoints, kafka_bootstrap, namespace):
    b = endpoints("Billing", machine="m2")
    mid = str(uuid.uuid4())
    p = plain_producer(kafka_bootstrap)
    p.produce(
        transport_queue_topic(namespace, "Billing"),
        key=mid.encode(),
        value=b"from a plain producer",
        headers=[
            ("Id", mid.encode()),
            ("Recoverable", b"false"),
            ("Headers", orjson.dumps(NSB_HEADERS)),
            ("CorrelationId", b"corr-plain"),
            ("ReplyToAddress", b"Legacy"),
            ("Expires", b"2099-01-01T00:00:00.250Z"),
            ("traceparent", b"00-ab-cd-01"),
        ],
    )
    assert p.flush(10) == 0
    m = b.receive(wait=15)
    assert m is not None
    assert (m.id, m.body, dict(m.headers)) == (mid, b"from a plain producer", NSB_HEADERS)
    assert (m.correlation_id, m.reply_to_address, m.recoverable) == ("corr-plain", "Legacy", False)
    assert m.expires == 4_070_908_800_250


def test_kafkas_console_producer_writes_a_transport_message_as_the_docs_show(endpoints, kafka_bootstrap, namespace):
    """docs/transport.md's console-producer line, run through Kafka's own ConsoleProducer: the
    headers' JSON holds `,` and `:`, so the separator is `;;` and only the first `:` of a header
    splits its name from its value."""
    from kbroker.embedded.jvm import find_java
    from kbroker.embedded.kafka_tools import tool_jars

    b = endpoints("Billing", machine="m2")
    mid = str(uuid.uuid4())
    headers = '{"NServiceBus.EnclosedMessageTypes":"Shop.OrderPlaced, Shop"}'
    line = f'Id:{mid};;Recoverable:true;;Headers:{headers}\t{mid}\t{{"order":1}}\n'
    cmd = [
        find_java(),
        "-cp",
        str(tool_jars(lambda _m: None) / "*"),
        "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server",
        kafka_bootstrap,
        "--topic",
        transport_queue_topic(namespace, "Billing"),
        "--reader-property",
        "parse.headers=true",
        "--reader-property",
        "headers.separator=;;",
        "--reader-property",
        "parse.key=true",
    ]
    done = subprocess.run(cmd, input=line, text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    m = b.receive(wait=20)
    assert m is not None
    assert (m.id, m.body, m.recoverable) == (mid, b'{"order":1}', True)
    assert dict(m.headers) == {"NServiceBus.EnclosedMessageTypes": "Shop.OrderPlaced, Shop"}


def test_a_malformed_record_is_dead_lettered_and_the_queue_goes_on(endpoints, kafka_bootstrap, namespace):
    b = endpoints("Billing", machine="m2")
    topic = transport_queue_topic(namespace, "Billing")
    good = str(uuid.uuid4())
    p = plain_producer(kafka_bootstrap)
    # Same partition: the good record comes after the malformed one.
    p.produce(topic, partition=0, key=b"k", value=b"no id", headers=[("Recoverable", b"true"), ("Headers", b"{}")])
    p.produce(
        topic,
        partition=0,
        key=good.encode(),
        value=b"good",
        headers=[("Id", good.encode()), ("Recoverable", b"true"), ("Headers", b"{}")],
    )
    assert p.flush(10) == 0
    with reader(kafka_bootstrap, names.deadletter_topic(namespace)) as dlq:
        m = b.receive(wait=15)
        assert m is not None and (m.id, m.body) == (good, b"good")
        recs = drain(dlq, until=1, timeout=10.0)
    assert [r.value() for r in recs] == [b"no id"]
    h = hdrs(recs[0])
    assert "missing column header(s) Id" in h["kb.dlq.reason"].decode()
    assert (h["kb.dlq.topic"], h["kb.dlq.partition"], h["kb.dlq.offset"]) == (topic.encode(), b"0", b"0")
    assert b.runtime.counters["dead_lettered"] == 1
    assert b.receive(wait=2) is None


def test_records_with_bad_column_values_are_dead_lettered_and_the_messages_around_them_go_on(
    endpoints, kafka_bootstrap, namespace
):
    """The transport queue's reader decodes each column's value once, as it comes. Between two
    good records on one partition, another client writes: an Id that is not UTF-8, Recoverable
    without a value, the Id column twice, a 200 KB Headers column that is not JSON. Each is
    dead-lettered with its reason; the good ones are received once, in order."""
    b = endpoints("Billing", machine="m2")
    topic = transport_queue_topic(namespace, "Billing")
    good = [str(uuid.uuid4()) for _ in range(2)]

    def columns(mid: bytes | None, **over: bytes | None) -> list[tuple[str, bytes | None]]:
        return [("Id", mid), ("Recoverable", over.get("Recoverable", b"true")), ("Headers", over.get("Headers", b"{}"))]

    bad = {
        "is not UTF-8": columns(b"\xff\xfe"),
        "Recoverable is ''": columns(str(uuid.uuid4()).encode(), Recoverable=None),
        "appears twice": columns(str(uuid.uuid4()).encode()) + [("Id", str(uuid.uuid4()).encode())],
        "Headers is not JSON": columns(str(uuid.uuid4()).encode(), Headers=b"{" * 200_000),
    }
    p = plain_producer(kafka_bootstrap)
    p.produce(topic, partition=0, key=good[0].encode(), value=b"first", headers=columns(good[0].encode()))
    for i, headers in enumerate(bad.values()):
        p.produce(topic, partition=0, key=b"bad-%d" % i, value=b"bad", headers=headers)
    p.produce(topic, partition=0, key=good[1].encode(), value=b"second", headers=columns(good[1].encode()))
    assert p.flush(10) == 0
    with reader(kafka_bootstrap, names.deadletter_topic(namespace)) as dlq:
        got = [b.receive(wait=15), b.receive(wait=15)]
        assert [(m.id, m.body) for m in got if m is not None] == [(good[0], b"first"), (good[1], b"second")]
        letters = drain(dlq, until=len(bad), timeout=20.0)
    reasons = [hdrs(r)["kb.dlq.reason"].decode() for r in letters]
    assert len(letters) == len(bad), reasons
    for problem in bad:
        assert sum(problem in r for r in reasons) == 1, (problem, reasons)
    assert b.receive(wait=2) is None


# --- queues nobody installed ------------------------------------------------------------------------------


def test_a_send_to_a_queue_nobody_installed_fails(endpoints):
    a = endpoints("Sales")
    with pytest.raises(TransportQueueNotFoundError) as info:
        a.send("Nobody", b"x")
    assert info.value.queue == "Nobody"
    with pytest.raises(TransportQueueNotFoundError):
        a.request("Nobody", b"x")
    with a.transaction() as tx:
        with pytest.raises(TransportQueueNotFoundError):
            tx.send("Nobody.m1", b"x")
    assert a._callbacks == {}  # the failed request left no callback behind
