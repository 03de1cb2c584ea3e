"""The transport-publish scenario: the transport face's publish fan-out
(`TransportTransaction.publish`, sdk/transport/publishing.py) against a plain transactional
producer writing the same copies, on the same broker, in the same repetition.

N events (`--messages`) of type OrderPlaced, each to SUBSCRIBERS endpoints:

    kbroker   endpoints Sub0..Sub4 installed, each `subscribe("OrderPlaced")` (acknowledged);
              then endpoint Sales, in transactions of PER_TRANSACTION
              `tx.publish("OrderPlaced", body, headers)` each: one copy (one Id) per subscriber
              queue, written with the transaction's commit through the group committer
    baseline  what a good Kafka user writes for the same fan-out: one transactional producer
              (idempotent, acks=all, the group committer's settings), and per event one transport
              record (the same body, the publish's headers) produced to each of 5 plain topics,
              a transaction committed every PER_TRANSACTION events

Both sides are timed from the first transaction's start until the last one committed; the
figure is the copies written per second (N x 5 / seconds). Before the clock each side commits
one transaction of one message to a queue of its own (Warmup: the producer's transactional id,
its connections and metadata; kbroker's copy of the subscription table is read then too).
Afterwards every subscriber queue and plain topic is read whole (read_committed): each must
hold every event's Id once, or the repetition fails."""

from __future__ import annotations

import gc
import time
from typing import Any

from kbroker.bench.common import side_by_side
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.scenarios.transport import HEADERS, SENDER, order_body, transport_namespace, transport_record
from kbroker.bench.scenarios.transport_delayed import delivered, read_ids
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.core.transport.subscriptions import MESSAGE_INTENT
from kbroker.kafka import clients
from kbroker.kafka.baseline import Delivery
from kbroker.kafka.clients import produce
from kbroker.sdk.transport.endpoint import TransportEndpoint

EVENT = "OrderPlaced"
SUBSCRIBERS = tuple(f"Sub{i}" for i in range(5))  # kbroker's subscribed endpoints (4 partitions each)
PLAIN = tuple(f"Plain{i}" for i in range(5))  # the baseline's plain topics (installed queues, 4 partitions)
WARMUP = "Warmup"  # each side's queue for its one warm-up transaction
PER_TRANSACTION = 100  # events per transaction, both sides (x 5 copies)
# The headers a copy carries, as the publish writes them (EnclosedMessageTypes, content type, intent).
PUBLISH_HEADERS = {**HEADERS, MESSAGE_INTENT: "Publish"}
TARGET, FLOOR = 0.5, 0.2
SUBSCRIBED_WITHIN = 10.0  # seconds for the publisher's copy of the table to show every subscriber


def checked(ctx: BenchContext, side: str, ids: list[str], topics: list[str]) -> dict[str, int]:
    """Each topic read whole: the copies there, lost and duplicated over all of them; a lost or
    duplicated copy fails the repetition."""
    expected = set(ids)
    total = {"copies": 0, "lost": 0, "duplicated": 0}
    for topic in topics:
        got = delivered(expected, read_ids(ctx, topic))
        total["copies"] += got["moved"]
        total["lost"] += got["lost"]
        total["duplicated"] += got["duplicated"]
    if total["lost"] or total["duplicated"] or total["copies"] != len(ids) * len(topics):
        raise RuntimeError(f"{side}: {len(ids):,} events to {len(topics)} queues not written exactly once: {total}")
    return total


def _rate(n: int, elapsed: float, cpu: float, copies: int) -> dict[str, Any]:
    return {
        "value": copies / elapsed,
        "detail": {
            "seconds": elapsed,
            "events_per_s": n / elapsed,
            "cpu_ms_per_copy": cpu * 1000 / copies,
        },
    }


# --- kbroker ------------------------------------------------------------------------------------


def subscribed(ctx: BenchContext, ns: str) -> None:
    """Sub0..Sub4, each subscribed to OrderPlaced (acknowledged); the endpoints closed after."""
    for name in SUBSCRIBERS:
        with TransportEndpoint(name, cluster=ctx.cluster, namespace=ns, secondary=False) as ep:
            ep.subscribe(EVENT)


def wait_subscribers(sales: TransportEndpoint) -> None:
    """Until the publisher's copy of the subscription table has every subscriber."""
    table = sales.runtime.subscriptions()
    deadline = time.monotonic() + SUBSCRIBED_WITHIN
    while len(found := table.subscribers([EVENT])) < len(SUBSCRIBERS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the publisher sees {len(found)} of {len(SUBSCRIBERS)} subscribers")
        table.stale()
        time.sleep(0.2)


def measure_kbroker(ctx: BenchContext, n: int, body: bytes) -> dict[str, Any]:
    """Sales's publishes, PER_TRANSACTION to a transaction, to the 5 subscribed endpoints."""
    ns = transport_namespace(ctx, "tpub-k", SENDER, WARMUP, *SUBSCRIBERS)
    subscribed(ctx, ns)
    sales = TransportEndpoint(SENDER, cluster=ctx.cluster, namespace=ns, secondary=False)
    ids: list[str] = []
    copies = n * len(SUBSCRIBERS)
    try:
        with sales.transaction() as tx:  # warm-up: the group committer's producer, the table's copy
            tx.send(WARMUP, body, HEADERS)
        wait_subscribers(sales)
        gc.collect()
        label = f"kbroker: {n:,} publishes to {len(SUBSCRIBERS)} subscribers, {PER_TRANSACTION} a transaction"
        with ctx.reporter.bar(label, n) as advance:
            cpu, t0 = time.process_time(), time.perf_counter()
            for start in range(0, n, PER_TRANSACTION):
                k = min(PER_TRANSACTION, n - start)
                with sales.transaction() as tx:
                    for _ in range(k):
                        ids.append(tx.publish(EVENT, body, HEADERS))
                advance(k)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
        kafka_transactions = sales.runtime.committer.batches
    finally:
        sales.close()
    out = _rate(n, elapsed, cpu, copies)
    got = checked(ctx, "kbroker", ids, [transport_queue_topic(ns, q) for q in SUBSCRIBERS])
    out["detail"].update(got, kafka_transactions=kafka_transactions)
    return out


# --- baseline -----------------------------------------------------------------------------------


def baseline_publish(ctx: BenchContext, n: int, body: bytes) -> dict[str, Any]:
    """What a good Kafka user writes for a fan-out to 5 queues: one transactional producer
    (idempotent, acks=all, linger 1 ms, the group committer's retry back-off), each event one
    transport record (a new Id, the publish's headers) produced to each of 5 plain topics, one
    transaction committed every PER_TRANSACTION events."""
    ns = transport_namespace(ctx, "tpub-b", WARMUP, *PLAIN)
    topics = [transport_queue_topic(ns, q) for q in PLAIN]
    producer = clients.transactional_producer(
        ctx.cluster, f"baseline.{ns}", **{"retry.backoff.ms": 1, "retry.backoff.max.ms": 5}
    )
    delivery = Delivery()
    ids: list[str] = []
    copies = n * len(PLAIN)
    producer.init_transactions(30)
    producer.begin_transaction()  # warm-up: one transaction of one record, as kbroker's
    key, value, hs = transport_record(body, HEADERS, SENDER)
    produce(producer, transport_queue_topic(ns, WARMUP), key=key, value=value, headers=hs, on_delivery=delivery)
    producer.commit_transaction(30)
    gc.collect()
    label = f"baseline: {n:,} events to {len(PLAIN)} plain topics, {PER_TRANSACTION} a transaction"
    with ctx.reporter.bar(label, n) as advance:
        cpu, t0 = time.process_time(), time.perf_counter()
        for start in range(0, n, PER_TRANSACTION):
            k = min(PER_TRANSACTION, n - start)
            producer.begin_transaction()
            for _ in range(k):
                key, value, hs = transport_record(body, PUBLISH_HEADERS, SENDER)
                ids.append(key.decode() if isinstance(key, bytes) else key)
                for topic in topics:
                    produce(producer, topic, key=key, value=value, headers=hs, on_delivery=delivery)
            producer.commit_transaction(30)  # flushes: every record acknowledged
            delivery.check()
            advance(k)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
    out = _rate(n, elapsed, cpu, copies)
    out["detail"].update(checked(ctx, "baseline", ids, topics))
    return out


# --- the scenario ------------------------------------------------------------------------------


def run_publish(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    n, body = ctx.params.messages, order_body(ctx.params.body_bytes)
    ctx.say(
        f"transport-publish: {n:,} events to {len(SUBSCRIBERS)} queues each "
        f"({n * len(SUBSCRIBERS):,} copies a side), {PER_TRANSACTION} events a transaction"
    )
    row = side_by_side(
        rep, lambda side: measure_kbroker(ctx, n, body) if side == "kbroker" else baseline_publish(ctx, n, body)
    )
    return {"transport-publish": row}


def _summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    if k and b and out.get("kbroker") is not None and out.get("baseline") is not None:
        cpu = ""
        if k.get("cpu_ms_per_copy") and b.get("cpu_ms_per_copy"):
            cpu = (
                f"; CPU ms/copy: kbroker {k['cpu_ms_per_copy']}, baseline {b['cpu_ms_per_copy']} "
                f"({k['cpu_ms_per_copy'] / b['cpu_ms_per_copy']:.2f}x)"
            )
        out["summary"] = (
            f"copies/s: kbroker {out['kbroker']:,.0f}, baseline {out['baseline']:,.0f} "
            f"(events/s {k.get('events_per_s', 0):,.0f} and {b.get('events_per_s', 0):,.0f}){cpu}; "
            f"none lost or duplicated"
        )


scenario(
    Scenario(
        name="transport-publish",
        description="the transport face's publish: one event's copies to 5 subscribed endpoints, in transactions",
        rows=(
            Row(
                "transport-publish",
                "copies/s",
                f"ratio >= {TARGET}",
                check=lambda r: r["ratio"] >= TARGET,
                floor=Floor(FLOOR, cpu=0.06, cpu_key="cpu_ms_per_copy"),
                baseline_code="kbroker/bench/scenarios/transport_fanout.py:baseline_publish; "
                "kbroker/kafka/clients.py:transactional_producer",
                notes=f"N events (--messages) of type {EVENT} to {len(SUBSCRIBERS)} endpoints; kbroker: Sub0..Sub4 "
                f"each subscribe('{EVENT}'), then Sales's tx.publish('{EVENT}', body, headers), "
                f"{PER_TRANSACTION} per transaction; baseline: one transactional producer (idempotent, acks=all) "
                f"producing each event's transport record to {len(PLAIN)} plain topics, a commit every "
                f"{PER_TRANSACTION} events. Copies written per second (N x {len(SUBSCRIBERS)} / seconds, the "
                "first transaction's start to the last commit); each queue is then read whole: a copy "
                "lost or there twice fails the scenario",
                finish=_summary,
            ),
        ),
        run=run_publish,
    )
)
