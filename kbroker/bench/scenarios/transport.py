"""The transport scenario (rows transport-send, transport-receive, transport-io-bound and the
informational transport-share-group): the transport face (kbroker.transport, NServiceBus's SQL
Server transport on Kafka) against plain confluent-kafka loops doing the same job on the same
records.

Every record is a transport message (kbroker.core.transport.message: key = Id, value = body,
headers Id / Recoverable / Headers / ReplyToAddress), written to transport queue topics
`kbroker.<ns>.tqueue.<queue>` with the installer's settings (4 partitions for a primary queue).
Each measurement installs its queues in a namespace of its own."""

from __future__ import annotations

import gc
import time
import uuid
from typing import Any, Callable

from kbroker.bench.common import (
    IO_DELAY,
    BacklogRecord,
    WireHeaders,
    json_body,
    side_by_side,
    write_backlog,
)
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.partition_workers import Clock, baseline_partition_workers
from kbroker.bench.usage import measured_with_usage
from kbroker.core.transport.endpoint import (
    FIXED,
    PRIMARY_PARTITIONS,
    InstallPlan,
    transport_queue_topic,
)
from kbroker.core.transport.message import (
    ENCLOSED_MESSAGE_TYPES,
    TransportMessage,
    from_record,
    new_message,
    to_headers,
)
from kbroker.kafka import clients, messages
from kbroker.kafka.baseline import (
    Delivery,
    failure,
    read_topic_to_end,
    share_consumer,
    transform_batches,
)
from kbroker.kafka.clients import produce
from kbroker.kafka.transport.queues import install
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.transaction import TransportTransaction

SENDER, ORDERS, PROCESSED, BILLING = "Sales", "Orders", "Processed", "Billing"
HEADERS = {ENCLOSED_MESSAGE_TYPES: "Sales.Messages.OrderPlaced", "NServiceBus.ContentType": "application/json"}
# The endpoints' concurrency model and MaximumConcurrencyLevel, the best measured on the
# development machine (2 cores; docs/benchmarks.md, "transport"): one transaction per message
# and the group committer batching them, so throughput grows with the transactions in flight
# until the process's CPU (one core's worth, the GIL) is spent, at about 128. fixed:128 was
# 5-15% ahead of monitor:128, and monitor:64 / monitor:32 further behind.
RECEIVE_MODEL, RECEIVE_CONCURRENCY = FIXED, 128
# transport-io-bound: the handler takes IO_DELAY per message. The thread-based endpoint
# (time.sleep) was ahead of the asyncio one (asyncio.sleep, AsyncTransportEndpoint: its commits
# go through an executor) by 20-40% at the same model and concurrency.
IO_MODEL, IO_CONCURRENCY = FIXED, 128
IO_SHARE = 4  # transport-io-bound handles --messages / IO_SHARE messages (the baseline's 5 ms each)
SHARE_FIRST_WITHIN = 30.0  # transport-share-group: a share consumer's first delivery takes ~5 s


def order_body(size: int) -> bytes:
    return json_body(size, order=1042, product="widget", quantity=3)


def transport_namespace(ctx: BenchContext, tag: str, *queues: str) -> str:
    """A new namespace holding transport queues `queues` (4 partitions each), as the installer
    creates them; deleted after the scenario on an external broker."""
    ns = f"bench-{tag}-{uuid.uuid4().hex[:8]}"[:40]
    ctx.namespaces.append(ns)
    install(ctx.cluster, ns, InstallPlan(tuple((q, PRIMARY_PARTITIONS) for q in queues)))
    return ns


def transport_record(body: bytes | None, headers: dict[str, str] | None, reply_to: str) -> BacklogRecord:
    """(key, value, headers) of a new recoverable transport message, as TransportEndpoint.send
    and TransportTransaction.send write it."""
    m = new_message(body, headers, now_ms=int(time.time() * 1000), reply_to_address=reply_to)
    hs: WireHeaders = list(to_headers(m))
    return m.id.encode(), body, hs


def preload(ctx: BenchContext, topic: str, n: int, body: bytes, label: str) -> None:
    """Write `n` transport messages to `topic` with a fast producer (not timed)."""
    write_backlog(ctx, topic, n, label, lambda _i: transport_record(body, HEADERS, SENDER))


def wait_committed(ctx: BenchContext, ep: TransportEndpoint, n: int, clock: Clock, label: str, deadline: float) -> None:
    """Wait (polling every 5 ms) until the endpoint committed `n` messages; sets clock.last."""
    with ctx.reporter.bar(label, n) as advance:
        last = 0
        while True:
            done = ep.runtime.counters.get("committed", 0)
            if done >= n:
                clock.finished()
                advance(done - last)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: only {done:,} of {n:,} messages committed in time (stats: {ep.stats()})")
            if done - last >= 1000:
                advance(done - last)
                last = done
            time.sleep(0.005)


# --- transport-send ----------------------------------------------------------------------------


def run_send(ctx: BenchContext, rep: int) -> dict[str, Any]:
    """TransportEndpoint.send of N recoverable messages, each acknowledged on return, against an
    idempotent acks=all producer flushing after each of the same records."""
    n, body = ctx.params.messages, order_body(ctx.params.body_bytes)
    ns = transport_namespace(ctx, "tsend", BILLING)
    topic = transport_queue_topic(ns, BILLING)
    ep = TransportEndpoint(SENDER, cluster=ctx.cluster, namespace=ns, secondary=False)
    producer = clients.idempotent_producer(ctx.cluster)  # the settings of the endpoint's sends
    reply_to = ep.settings.reply_address

    def kbroker_sends(count: int, advance: Callable[[int], None]) -> None:
        for i in range(count):
            ep.send(BILLING, body, HEADERS)
            if i % 1000 == 999:
                advance(1000)

    def baseline_sends(count: int, advance: Callable[[int], None]) -> None:
        delivery = Delivery()
        for i in range(count):
            key, value, hs = transport_record(body, HEADERS, reply_to)
            producer.produce(topic, key=key, value=value, headers=hs, on_delivery=delivery)
            delivery.check(producer.flush(30))
            if i % 1000 == 999:
                advance(1000)

    def measure(side: str) -> dict[str, Any]:
        send = kbroker_sends if side == "kbroker" else baseline_sends
        gc.collect()
        with ctx.reporter.bar(f"{side}: {n:,} sends, each acknowledged", n) as advance:
            t0 = time.perf_counter()
            send(n, advance)
            elapsed = time.perf_counter() - t0
            advance(n % 1000)
        return {"value": n / elapsed, "detail": {"seconds": elapsed}}

    try:
        kbroker_sends(20, lambda _n: None)  # warm-up: connections, metadata, the queue look-up
        baseline_sends(20, lambda _n: None)
        return side_by_side(rep, measure)
    finally:
        ep.close()
        producer.flush(30)


# --- transport-receive ---------------------------------------------------------------------------


def _run_endpoint(
    ctx: BenchContext,
    ns: str,
    handler: Callable[[TransportMessage, TransportTransaction], None],
    model: str,
    concurrency: int,
    n: int,
    clock: Clock,
    label: str,
    deadline: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """kbroker's side: an endpoint of Orders in `ns` started with `handler`, until it committed
    `n` messages. Returns its stats and the detail both rows give (peak tasks, Kafka
    transactions)."""
    ep = TransportEndpoint(
        ORDERS, cluster=ctx.cluster, namespace=ns, secondary=False, concurrency=model, max_concurrency=concurrency
    )
    try:
        ep.start(handler)
        wait_committed(ctx, ep, n, clock, label, deadline)
        stats = ep.stats()
        return stats, {
            "peak_tasks": stats["readers"][0].get("peak"),
            "kafka_transactions": ep.runtime.committer.batches,
        }
    finally:
        ep.close()


def measure_receive(ctx: BenchContext, side: str, n: int) -> dict:
    """Receive-handle-commit of `n` preloaded messages on Orders, each handler sending one
    message to Processed in the receive's transaction."""
    ns = transport_namespace(ctx, f"trecv-{side[0]}", ORDERS, PROCESSED)
    in_topic, out_topic = transport_queue_topic(ns, ORDERS), transport_queue_topic(ns, PROCESSED)
    preload(ctx, in_topic, n, order_body(ctx.params.body_bytes), f"{side}: {n:,} messages on {ORDERS}")
    clock, deadline = Clock(), time.monotonic() + 120 + n / 100
    gc.collect()
    t_start = time.perf_counter()
    if side == "kbroker":

        def handler(msg: TransportMessage, tx: TransportTransaction) -> None:
            clock.started()
            tx.send(PROCESSED, msg.body)

        stats, detail = _run_endpoint(
            ctx,
            ns,
            handler,
            RECEIVE_MODEL,
            RECEIVE_CONCURRENCY,
            n,
            clock,
            f"kbroker: {RECEIVE_MODEL}, max_concurrency {RECEIVE_CONCURRENCY}",
            deadline,
        )
        detail.update(failed=stats["counters"].get("failed", 0), rolled_back=stats["counters"].get("rolled_back", 0))
    else:
        baseline_transform(ctx, in_topic, out_topic, n, clock, deadline)
        detail = {}
    written = read_topic_to_end(ctx.cluster, out_topic, timeout=120)
    if written != n:
        raise RuntimeError(f"{side}: {written:,} messages committed to {PROCESSED}, not {n:,}")
    return {"value": clock.rate(n), "detail": {**clock.detail(n, t_start), **detail}}


def baseline_transform(ctx: BenchContext, in_topic: str, out_topic: str, n: int, clock: Clock, deadline: float) -> None:
    """A hand-written consume-transform-produce loop: a read_committed consumer, a transactional
    producer with the settings of kbroker's group committer, send_offsets_to_transaction, one
    commit every 100 records or 100 ms. Each record is decoded as a transport message and its
    body sent to Processed as a new one."""
    consumer = clients.consumer(ctx.cluster, f"baseline.{in_topic}", **{"auto.offset.reset": "earliest"})
    producer = clients.transactional_producer(
        ctx.cluster, f"baseline.{in_topic}", **{"retry.backoff.ms": 1, "retry.backoff.max.ms": 5}
    )
    done = 0

    def transform(rec: Any) -> None:  # a consumed record
        clock.started()
        msg = from_record(messages.headers(rec), rec.value())
        key, value, hs = transport_record(msg.body, None, ORDERS)
        producer.produce(out_topic, key=key, value=value, headers=hs)

    def running() -> bool:
        if done >= n:
            return False
        if time.monotonic() > deadline:
            raise RuntimeError(f"baseline: only {done:,} of {n:,} messages committed in time")
        return True

    try:
        producer.init_transactions(30)
        consumer.subscribe([in_topic])
        with ctx.reporter.bar("baseline: consume-transform-produce", n) as advance:

            def committed(batch: list[None]) -> None:
                nonlocal done
                done += len(batch)
                advance(len(batch))

            transform_batches(consumer, producer, transform, committed, running)
            clock.finished()
    finally:
        consumer.close()


# --- transport-io-bound ----------------------------------------------------------------------------


def measure_io_bound(ctx: BenchContext, side: str, n: int) -> dict:
    """A handler that takes IO_DELAY per message, on a 4-partition queue of `n` messages; the
    detail has the side's CPU time and peak RSS (bench/usage.py)."""
    return measured_with_usage(_measure_io_bound, ctx, side, n)


def _measure_io_bound(ctx: BenchContext, side: str, n: int) -> dict:
    ns = transport_namespace(ctx, f"tio-{side[0]}", ORDERS)
    topic = transport_queue_topic(ns, ORDERS)
    preload(ctx, topic, n, order_body(ctx.params.body_bytes), f"{side}: {n:,} messages on {ORDERS}")
    clock, deadline = Clock(), time.monotonic() + 60 + n * IO_DELAY * 1.5
    gc.collect()
    t_start = time.perf_counter()
    detail: dict[str, Any] = {}
    if side == "kbroker":

        def handler(_msg: TransportMessage, _tx: TransportTransaction) -> None:
            clock.started()
            time.sleep(IO_DELAY)

        _, detail = _run_endpoint(
            ctx,
            ns,
            handler,
            IO_MODEL,
            IO_CONCURRENCY,
            n,
            clock,
            f"kbroker: threads, {IO_MODEL}, max_concurrency {IO_CONCURRENCY}",
            deadline,
        )
    else:
        baseline_partition_workers(ctx, topic, n, clock, deadline)
    return {"value": clock.rate(n), "detail": {**clock.detail(n, t_start), **detail}}


# --- transport-share-group (informational) ----------------------------------------------------------


def measure_share_group(ctx: BenchContext, n: int) -> dict:
    """A share consumer (KIP-932) receiving the preloaded messages, sending each body to
    Processed with an idempotent producer and acknowledging the records once their sends are
    acknowledged (at least once: the acknowledgements cannot join a Kafka transaction)."""
    ns = transport_namespace(ctx, "tshare", ORDERS, PROCESSED)
    in_topic, out_topic = transport_queue_topic(ns, ORDERS), transport_queue_topic(ns, PROCESSED)
    preload(ctx, in_topic, n, order_body(ctx.params.body_bytes), f"share group: {n:,} messages on {ORDERS}")
    clock, deadline = Clock(), time.monotonic() + 120 + n / 100
    first_deadline = time.monotonic() + SHARE_FIRST_WITHIN
    gc.collect()
    t_start = time.perf_counter()
    consumer = share_consumer(ctx.cluster, f"baseline.share.{in_topic}", in_topic)
    producer, delivery = clients.idempotent_producer(ctx.cluster), Delivery()
    done = 0
    try:
        with ctx.reporter.bar("share consumer: receive, send, acknowledge", n) as advance:
            while done < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {done:,} of {n:,} messages acknowledged in time")
                if clock.first is None and time.monotonic() > first_deadline:
                    raise RuntimeError(
                        f"no record delivered within {SHARE_FIRST_WITHIN:.0f} s of subscribing "
                        "(share groups not enabled on this broker?)"
                    )
                got = 0
                for rec in consumer.poll(0.1):
                    if rec.error():
                        raise failure(rec)
                    clock.started()
                    msg = from_record(messages.headers(rec), rec.value())
                    key, value, hs = transport_record(msg.body, None, ORDERS)
                    produce(producer, out_topic, key=key, value=value, headers=hs, on_delivery=delivery)
                    consumer.acknowledge(rec)
                    got += 1
                if got:
                    delivery.check(producer.flush(30))  # the sends first: at least once
                    consumer.commit_sync(30)
                    done += got
                    advance(got)
            clock.finished()
    finally:
        consumer.close()
        producer.flush(30)
    written = read_topic_to_end(ctx.cluster, out_topic, timeout=120)
    if written < n:
        raise RuntimeError(f"{written:,} messages written to {PROCESSED}, fewer than {n:,}")
    return {"value": clock.rate(n), "detail": {**clock.detail(n, t_start), "duplicates": written - n}}


# --- the scenario ------------------------------------------------------------------------------


def run_transport(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    n = ctx.params.messages
    io_n = max(1, n // IO_SHARE)
    out: dict[str, dict] = {"transport-send": run_send(ctx, rep)}
    receive = out["transport-receive"] = side_by_side(rep, lambda side: measure_receive(ctx, side, n))
    out["transport-io-bound"] = side_by_side(rep, lambda side: measure_io_bound(ctx, side, io_n))
    share_row: dict[str, Any] = {"kbroker": receive["kbroker"], "kbroker_detail": receive["kbroker_detail"]}
    try:  # informational: a broker without share groups costs this row only
        share = measure_share_group(ctx, n)
        share_row["baseline"], share_row["baseline_detail"] = share["value"], share["detail"]
    except Exception as exc:  # noqa: BLE001 - informational: the row says why it is missing
        ctx.say(f"[yellow]transport-share-group: not measured: {exc}[/yellow]")
        share_row["baseline"], share_row["skipped_reason"] = None, f"share consumer: {type(exc).__name__}: {exc}"
    out["transport-share-group"] = share_row
    return out


def _io_summary(out: dict) -> None:
    k, b = out.get("kbroker"), out.get("baseline")
    if k is not None and b is not None:
        out["summary"] = (
            f"achieved {k:,.0f} msg/s against {b:,.0f} msg/s (the baseline's ceiling is "
            f"{PRIMARY_PARTITIONS / IO_DELAY:,.0f}): ratio {k / b:.2f}"
        )


scenario(
    Scenario(
        name="transport",
        description="the transport face (NServiceBus's SQL Server transport on Kafka): send, transactional "
        "receive, I/O-bound handlers",
        rows=(
            Row(
                "transport-send",
                "msg/s",
                "ratio >= 0.8",
                check=lambda r: r["ratio"] >= 0.8,
                floor=Floor(0.4),
                baseline_code="kbroker/bench/scenarios/transport.py:run_send (baseline_sends); "
                "kbroker/kafka/clients.py:idempotent_producer",
                notes="TransportEndpoint.send of N recoverable messages (each acknowledged by every in-sync "
                "replica before it returns) to an installed queue vs an idempotent acks=all Producer "
                "writing the same records (topic, key = Id, value, column headers) and flushing after each",
            ),
            Row(
                "transport-receive",
                "msg/s",
                "ratio >= 0.5",
                check=lambda r: r["ratio"] >= 0.5,
                floor=Floor(0.25, cpu=0.5),
                baseline_code="kbroker/bench/scenarios/transport.py:baseline_transform; "
                "kbroker/kafka/baseline.py:transform_batches",
                notes=f"N messages preloaded on Orders (4 partitions); kbroker: an endpoint started with "
                f"concurrency={RECEIVE_MODEL}, max_concurrency={RECEIVE_CONCURRENCY}, its handler "
                "tx.send('Processed', body) per message (one transaction per message, group-committed); "
                "baseline: consume-transform-produce, read_committed consumer, transactional producer, "
                "send_offsets_to_transaction, commit every 100 records or 100 ms. Timed from the first "
                "message handed out to the last committed; Processed is checked to hold exactly N",
            ),
            Row(
                "transport-io-bound",
                "msg/s",
                "ratio >= 10",
                check=lambda r: r["ratio"] >= 10,
                floor=Floor(2, cpu=0.5),
                baseline_code="kbroker/bench/partition_workers.py:baseline_partition_workers",
                notes=f"N/{IO_SHARE} messages on a 4-partition queue, a handler taking {IO_DELAY * 1000:.0f} ms; "
                "kbroker: TransportEndpoint, time.sleep, "
                f"concurrency={IO_MODEL}, max_concurrency={IO_CONCURRENCY}, one transaction per message; "
                "baseline: one consumer, a worker thread per partition handling its records in order, "
                "offsets committed every 100 ms. Timed from the first message handed out to the last "
                "committed; each side's detail has its CPU seconds and peak RSS (bench/usage.py)",
                finish=_io_summary,
            ),
            Row(
                "transport-share-group",
                "msg/s",
                None,
                baseline_code="kbroker/bench/scenarios/transport.py:measure_share_group; "
                "kbroker/kafka/baseline.py:share_consumer",
                notes="informational: kbroker = transport-receive's kbroker figure of the same repetition; "
                "baseline = a KIP-932 ShareConsumer (explicit acknowledgement) receiving the same N "
                "preloaded messages, sending each body to Processed with an idempotent producer, "
                "flushing and then commit_sync() of the acknowledgements per poll: at least once, since "
                "share-group acknowledgements cannot join a Kafka transaction",
            ),
        ),
        run=run_transport,
    )
)
