"""Recoverability of the transport face (core/transport/recoverability.py, sdk/transport/runtime.py,
sdk/transport/error_retry.py) against the real broker: immediate retries, then delayed retries
through the delayed store, then the error queue with NServiceBus's failure headers and the
message's own; unrecoverable exceptions straight there; a message that recovers is handled once;
`kbroker endpoint errors` lists them and `retry` sends them back exactly once, to success; and
an auditing endpoint's copy of each message it processed."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from kbroker.core.transport.audit import PROCESSING_ENDED, PROCESSING_STARTED
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import (
    EXCEPTION_MESSAGE,
    EXCEPTION_STACK_TRACE,
    EXCEPTION_TYPE,
    FAILED_Q,
    PROCESSING_ENDPOINT,
    PROCESSING_MACHINE,
    RETRIES,
    TIME_OF_FAILURE,
    Recoverability,
)
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.error_retry import chooser, retry_failed
from tests.helpers import wait_for
from tests.integration.test_catalog_apply import run_cli

FAST = Recoverability(immediate_retries=2, delayed_retries=2, time_increase=0.5)


class Refused(Exception):
    """What the handlers of these tests raise."""


def errors_of(ep: TransportEndpoint, n: int, seconds: float = 30.0) -> list[TransportMessage]:
    """The first `n` messages of the error queue, received (removed) by `ep`."""
    got: list[TransportMessage] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        msg = ep.receive(0.5, queue="error")
        if msg is not None:
            got.append(msg)
    return got


def test_a_failing_message_is_retried_then_goes_to_the_error_queue(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    attempts: list[tuple[int, float]] = []

    def handle(msg: TransportMessage, tx: Any) -> None:
        attempts.append((int(msg.headers.get(RETRIES, "0")), time.time()))
        tx.send("Audit", b"never sent: the handler fails")
        raise Refused("the order is refused")

    endpoints("Audit")
    sales = endpoints("Sales", recoverability=FAST).start(handle)
    mid = sales.send("Sales", b"order", {"my": "header"})
    reader = endpoints("Reader")
    got = errors_of(reader, 1, 40)
    assert [m.id for m in got] == [mid]
    # 3 attempts (1 + 2 immediate retries) in each of 3 rounds (the first, 2 delayed retries)
    assert Counter(r for r, _ in attempts) == {0: 3, 1: 3, 2: 3}
    first_of = {r: min(t for rr, t in attempts if rr == r) for r in (1, 2)}
    last_of = {r: max(t for rr, t in attempts if rr == r) for r in (0, 1)}
    assert first_of[1] - last_of[0] >= 0.45 and first_of[2] - last_of[1] >= 0.95  # 0.5 s, then 1.0 s later
    h = got[0].headers
    assert h["my"] == "header" and got[0].body == b"order"
    assert h[FAILED_Q] == "Sales" and h[PROCESSING_ENDPOINT] == "Sales" and h[PROCESSING_MACHINE] == "m1"
    assert h[EXCEPTION_TYPE].endswith("Refused") and h[EXCEPTION_MESSAGE] == "the order is refused"
    assert "Refused: the order is refused" in h[EXCEPTION_STACK_TRACE] and h[RETRIES] == "2"
    assert len(h[TIME_OF_FAILURE]) == len("2026-12-02 10:00:00:123456 Z") and h[TIME_OF_FAILURE].endswith(" Z")
    assert endpoints("Audit", machine="m2").receive(1.0) is None  # the failed handler's send: never
    c = sales.stats()["counters"]
    assert c["delayed_retries"] == 2 and c["errors"] == 1


def test_unrecoverable_exceptions_skip_the_retries_and_a_recovering_message_is_handled_once(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    calls: Counter[bytes | None] = Counter()

    def handle(msg: TransportMessage, tx: Any) -> None:
        calls[msg.body] += 1
        if msg.body == b"bad":
            raise ValueError("malformed order")
        if msg.body == b"flaky" and calls[msg.body] < 3:
            raise Refused("not yet")
        tx.send("Done", msg.body)

    endpoints("Done")
    policy = Recoverability(immediate_retries=5, delayed_retries=1, time_increase=0.5, unrecoverable=(ValueError,))
    sales = endpoints("Sales", recoverability=policy).start(handle)
    bad = sales.send("Sales", b"bad")
    sales.send("Sales", b"flaky")
    reader = endpoints("Reader")
    assert [m.id for m in errors_of(reader, 1, 20)] == [bad]
    done = endpoints("Done", machine="m2")
    assert [m.body for m in [done.receive(5.0)]] == [b"flaky"]
    assert calls == {b"bad": 1, b"flaky": 3}
    assert done.receive(1.0) is None and reader.receive(1.0, queue="error") is None


def test_errors_lists_and_retry_sends_back_exactly_once_to_success(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    fixed = threading.Event()
    handled: Counter[str] = Counter()

    def handle(msg: TransportMessage, tx: Any) -> None:
        if not fixed.is_set():
            raise Refused("the database is down")
        handled[msg.id] += 1

    no_retries = Recoverability(immediate_retries=0, delayed_retries=0)
    billing = endpoints("Billing", recoverability=no_retries).start(handle)
    shipping = endpoints("Shipping", recoverability=no_retries).start(handle)
    b_ids = [billing.send("Billing", f"b{i}".encode()) for i in range(3)]
    s_id = shipping.send("Shipping", b"s")

    def cli(*args: str) -> Any:
        proc = run_cli(kafka_bootstrap, "endpoint", *args, "--namespace", namespace, "--json")
        assert proc.returncode == 0, proc.stderr
        return orjson.loads(proc.stdout)

    wait_for(lambda: cli("errors")["waiting"] == 4, 30, "4 failed messages in the error queue")
    listed = cli("errors", "--endpoint", "Billing")["messages"]
    assert sorted(r["Id"] for r in listed) == sorted(b_ids)
    assert {r["failed_queue"] for r in listed} == {"Billing"} and listed[0]["message"] == "the database is down"
    fixed.set()
    started = time.monotonic()
    out = cli("retry", b_ids[0])
    assert out["sent_back"] == [b_ids[0]] and out["kept"] == 3 and out["not_found"] == []
    wait_for(lambda: handled[b_ids[0]] == 1, 20, "the retried message handled")
    round_trip = time.monotonic() - started
    out = cli("retry", "--endpoint", "Billing")
    assert sorted(out["sent_back"]) == sorted(b_ids[1:]) and out["kept"] == 1
    retried = retry_failed(kafka_bootstrap, namespace, chooser(every=True))
    assert retried.sent_back == [s_id] and retried.kept == 0
    wait_for(lambda: len(handled) == 4, 20, "every message handled", seen=lambda: handled)
    time.sleep(1.0)
    assert set(handled.values()) == {1}, handled  # exactly once each
    assert cli("errors")["waiting"] == 0
    assert cli("retry", "--all") == {"sent_back": [], "kept": 0, "unretriable": [], "not_found": []}
    missing = run_cli(kafka_bootstrap, "endpoint", "retry", b_ids[0], "--namespace", namespace)
    assert missing.returncode == 3 and f"{b_ids[0]}: not in error" in missing.stdout
    both = run_cli(kafka_bootstrap, "endpoint", "retry", "--all", "--endpoint", "X", "--namespace", namespace)
    assert both.returncode == 1 and both.stderr.startswith("kbroker: error: name the messages")
    print(f"\na failed message's round trip, from `kbroker endpoint retry` to handled: {round_trip:.2f} s")


def test_an_auditing_endpoint_copies_each_processed_message_in_its_transaction(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    def handle(msg: TransportMessage, tx: Any) -> None:
        if msg.body == b"fails":
            raise ValueError("never processed")
        tx.send("Done", msg.body)

    endpoints("Done")
    no_retries = Recoverability(immediate_retries=0, delayed_retries=0)
    sales = endpoints("Sales", audit_queue="audit", recoverability=no_retries).start(handle)
    before = time.time()
    ok = sales.send("Sales", b"ok", {"mine": "kept"})
    sales.send("Sales", b"fails")
    auditor = endpoints("Auditor")
    got = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        msg = auditor.receive(0.5, queue="audit")
        if msg is not None:
            got.append(msg)
    assert [m.id for m in got] == [ok]
    h = got[0].headers
    assert h["mine"] == "kept" and h[PROCESSING_ENDPOINT] == "Sales" and h[PROCESSING_MACHINE] == "m1"
    started, ended = h[PROCESSING_STARTED], h[PROCESSING_ENDED]
    assert started <= ended and started[:10] == time.strftime("%Y-%m-%d", time.gmtime(before))
    assert len(errors_of(auditor, 1, 20)) == 1  # the failed one: in the error queue, never audited
    assert auditor.receive(1.0, queue="audit") is None


def test_receiving_that_keeps_failing_raises_the_critical_error_once(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    """An instance started on a queue nobody installed: every receive fails. After the breaker's
    time the critical-error callback is called, once; installing the queue lets receiving work,
    which arms the breaker again."""
    critical: list[BaseException] = []
    ep = endpoints(
        "Orphan",
        install=False,
        secondary=False,
        on_critical_error=critical.append,
        time_to_wait_before_critical_error=1.5,
        concurrency="fixed",
        max_concurrency=1,
    )
    started = time.monotonic()
    ep.start(lambda msg, tx: None)
    wait_for(lambda: critical, 15, "the critical error")
    assert time.monotonic() - started >= 1.5
    assert "Orphan" in str(critical[0])
    time.sleep(2.0)
    assert len(critical) == 1  # once, while it goes on failing
    ep.install()
    wait_for(lambda: ep.breaker.failures == 0, 30, "receiving working again", seen=lambda: ep.breaker.failures)


def test_garbage_in_the_error_queue_is_skipped_and_the_failed_messages_around_it_go_on(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    """Another client may write anything to the error queue: `errors` lists the failed messages
    around such records, and `retry` sends those back and moves the garbage to the dead-letter
    topic; a message whose FailedQ names no installed queue is kept."""
    from confluent_kafka import Producer

    from kbroker.core.transport.endpoint import transport_queue_topic
    from kbroker.core.transport.message import new_message, to_headers
    from kbroker.kafka.transport.error_queue import waiting

    fixed = threading.Event()
    handled: list[str] = []

    def handle(msg: TransportMessage, tx: Any) -> None:
        if not fixed.is_set():
            raise Refused("down")
        handled.append(msg.id)

    billing = endpoints("Billing", recoverability=Recoverability(immediate_retries=0, delayed_retries=0))
    billing.start(handle)
    good = billing.send("Billing", b"ok")
    wait_for(lambda: waiting(kafka_bootstrap, namespace, "error")[1] == 1, 30, "the failed message")
    error_topic = transport_queue_topic(namespace, "error")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(error_topic, key=b"g1", value=b"no columns at all")
    p.produce(error_topic, key=b"g2", value=b"x" * 100_000, headers=[("Id", b"not a guid"), ("Headers", b"{")])
    forged = new_message(b"f", {FAILED_Q: "NoSuchQueue"}, now_ms=int(time.time() * 1000))
    p.produce(error_topic, key=forged.id.encode(), value=forged.body, headers=to_headers(forged))
    assert p.flush(10) == 0
    listed, total = waiting(kafka_bootstrap, namespace, "error")
    assert total == 4 and sorted(m.id for m in listed) == sorted([good, forged.id])  # the garbage: counted, not listed
    fixed.set()
    out = retry_failed(kafka_bootstrap, namespace, chooser(every=True))
    assert out.sent_back == [good] and out.unretriable == [forged.id] and out.kept == 1
    wait_for(lambda: handled == [good], 20, "the good message handled again")
    left, total = waiting(kafka_bootstrap, namespace, "error")
    assert [m.id for m in left] == [forged.id] and total == 1  # the garbage went to the dead-letter topic
