"""The limits scenario: what the broker itself allows on this machine, beside kbroker doing the
same job in the same repetition. Kafka's own tools, run against the bench's broker: its
ProducerPerformance (records of the bench's body size, acks=all, idempotent, as fast as it goes)
against kbroker's SENDs in one transaction, and its EndToEndLatency (one record produced,
acknowledged, polled and committed at a time) against a SEND and a RECEIVE outside a
transaction on one dialog. No target: these rows say how far the Kafka-level targets can go."""

from __future__ import annotations

import gc
import re
import time
import uuid
from typing import Any

from kbroker.bench.common import CLAIM, CONTRACT, EMP, EXP, QUEUE, claim_body, details, percentile, side_by_side
from kbroker.bench.harness import BenchContext, Row, Scenario, Skip, scenario
from kbroker.bench.scenarios.send import KBrokerSender
from kbroker.core import names
from kbroker.embedded.kafka_tools import run_tool
from kbroker.errors import KBrokerError
from kbroker.kafka.topics import create_missing_topics
from kbroker.sdk.broker import Broker

HOPS = 500  # records timed per side and repetition (after WARM_UP)
WARM_UP = 20
TOOL_SECONDS = 300.0
PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
END_TO_END_LATENCY = "org.apache.kafka.tools.EndToEndLatency"
# "20000 records sent, 154004.0 records/sec (14.69 MB/sec), ..."
_RATE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec")
# "Percentiles: 50th = 1, 99th = 9, 99.9th = 12" (whole milliseconds)
_PERCENTILES = re.compile(r"Percentiles: 50th = (\d+), 99th = (\d+)")
_AVERAGE = re.compile(r"Avg latency: ([\d.]+) ms")


def _tool(ctx: BenchContext, main_class: str, args: list[str]) -> str:
    try:
        return run_tool(ctx.cluster, main_class, args, TOOL_SECONDS, ctx.say)
    except KBrokerError as exc:  # no Java or Maven here, or the tool refused: the row says so
        raise Skip(f"Kafka's {main_class.rsplit('.', 1)[-1]} did not run: {exc}") from None


def _topic(ctx: BenchContext, ns: str, partitions: int) -> str:
    """A topic of the namespace for a tool's records, which no kbroker reader reads."""
    topic = f"{names.prefix(ns)}limit-{uuid.uuid4().hex[:8]}"
    create_missing_topics(ctx.cluster, {topic: partitions}, {}, timeout=30)
    return topic


def _producer_performance(ctx: BenchContext, topic: str) -> dict[str, Any]:
    """Kafka's ProducerPerformance: the bench's messages, its body size, acks=all, idempotent."""
    p = ctx.params
    out = _tool(
        ctx,
        PRODUCER_PERFORMANCE,
        [
            "--topic", topic, "--num-records", str(p.messages), "--record-size", str(p.body_bytes),
            "--throughput", "-1", "--command-property", "acks=all", "enable.idempotence=true",
        ],
    )  # fmt: skip
    found = _RATE.findall(out)
    if not found:
        raise RuntimeError(f"ProducerPerformance printed no rate: {out[-300:]!r}")
    sent, rate = found[-1]
    return {"value": float(rate), "detail": {"records": int(sent)}}


def _end_to_end_latency(ctx: BenchContext, topic: str) -> dict[str, Any]:
    """Kafka's EndToEndLatency: one record at a time, acks=all, the bench's body size."""
    out = _tool(
        ctx,
        END_TO_END_LATENCY,
        ["--topic", topic, "--num-records", str(WARM_UP + HOPS), "--producer-acks", "all",
         "--record-size", str(ctx.params.body_bytes)],
    )  # fmt: skip
    found, average = _PERCENTILES.search(out), _AVERAGE.search(out)
    if found is None or average is None:
        raise RuntimeError(f"EndToEndLatency printed no percentiles: {out[-300:]!r}")
    p50, p99 = (float(v) for v in found.groups())
    detail = {"p50_ms": p50, "p99_ms": p99, "mean_ms": float(average.group(1)), "records": WARM_UP + HOPS}
    return {"value": p50, "detail": detail}


def _kbroker_hops(ctx: BenchContext, ns: str) -> dict[str, Any]:
    """One dialog: a SEND (acknowledged), then a RECEIVE outside a transaction (removed on
    return) of that message, one at a time, each timed from before the SEND."""
    broker, body = Broker(ctx.cluster, ns), claim_body(ctx.params.body_bytes)
    try:
        handle = broker.begin_dialog(EMP, EXP, CONTRACT)
        gc.collect()
        hops: list[float] = []
        for i in range(WARM_UP + HOPS):
            t0 = time.perf_counter()
            broker.send(handle, CLAIM, body)
            if not broker.receive(QUEUE, wait=30):
                raise RuntimeError("kbroker: the message sent did not arrive within 30 s")
            if i >= WARM_UP:
                hops.append((time.perf_counter() - t0) * 1000)
    finally:
        broker.close()
    hops.sort()
    p50, p99 = percentile(hops, 50), percentile(hops, 99)
    detail = {"p50_ms": p50, "p99_ms": p99, "mean_ms": sum(hops) / len(hops), "records": len(hops)}
    return {"value": p50, "detail": detail}


def run_limits(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    p = ctx.params
    ns = ctx.fresh_namespace("limits")
    conversations = max(1, min(p.conversations, p.messages))
    sender = KBrokerSender(ctx, ns, conversations, claim_body(p.body_bytes))
    try:
        produce_topic = _topic(ctx, ns, 4)  # as many partitions as the queue SENDs go to

        def produce(side: str) -> dict[str, Any]:
            return sender.run(p.messages, True) if side == "kbroker" else _producer_performance(ctx, produce_topic)

        produced = side_by_side(rep, produce)
    finally:
        sender.close()
    latency_topic = _topic(ctx, ns, 1)

    def hop(side: str) -> dict[str, Any]:
        return _kbroker_hops(ctx, ns) if side == "kbroker" else _end_to_end_latency(ctx, latency_topic)

    return {"limit-produce": produced, "limit-latency": side_by_side(rep, hop)}


def _latency_summary(out: dict) -> None:
    k, b = details(out)
    if k or b:
        out["summary"] = (
            f"one hop p50/p99/mean ms: kbroker {k.get('p50_ms')}/{k.get('p99_ms')}/{_ms(k.get('mean_ms'))}, "
            f"Kafka's EndToEndLatency {b.get('p50_ms')}/{b.get('p99_ms')}/{_ms(b.get('mean_ms'))} "
            "(its percentiles in whole ms)"
        )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


scenario(
    Scenario(
        name="limits",
        description="Kafka's own ProducerPerformance and EndToEndLatency beside kbroker, on the same broker",
        rows=(
            Row(
                "limit-produce",
                "msg/s",
                None,
                baseline_code="kbroker/bench/scenarios/limits.py:_producer_performance "
                "(Kafka's org.apache.kafka.tools.ProducerPerformance)",
                notes="the broker's limit for producing: kbroker's N SENDs in one transaction (as "
                "send-pipelined) vs Kafka's ProducerPerformance writing N records of the body size, "
                "acks=all, idempotent, --throughput -1, in its own JVM",
            ),
            Row(
                "limit-latency",
                "ms (p50)",
                None,
                baseline_code="kbroker/bench/scenarios/limits.py:_end_to_end_latency "
                "(Kafka's org.apache.kafka.tools.EndToEndLatency)",
                notes=f"one hop at a time, {HOPS} after {WARM_UP}: kbroker's SEND on one dialog and "
                "the RECEIVE outside a transaction that removes it vs Kafka's EndToEndLatency "
                "(produce with acks=all, poll, commit); its percentiles are whole milliseconds. "
                "Lower is better",
                finish=_latency_summary,
            ),
        ),
        run=run_limits,
        not_quick="runs Kafka's own tools, a JVM each: the broker's limits, not a regression guard",
    )
)
