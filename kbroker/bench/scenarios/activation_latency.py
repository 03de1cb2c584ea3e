"""The activation-latency scenario: from a message arriving on an idle activated queue (monitor
INACTIVE, no reader running) to the first RECEIVE of the reader it activated returning it; p50
and p99. Baseline: a plain consumer already polling its queue."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kbroker.bench.activation import WorkerProcess, handlers_for, idle, wait_monitor
from kbroker.bench.common import (
    QUEUE,
    claim_body,
    claim_headers,
    percentile,
    sides,
)
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.kafka import clients
from kbroker.kafka.baseline import (
    Delivery,
    is_partition_eof,
    sdk_like_producer,
)
from kbroker.kafka.queue_views import alter_queue_activation

LATENCY_PROCEDURE = "kbroker.bench.procedures:first_receive"
LATENCY_TARGET_MS = 1_000.0


# --- activation-latency -------------------------------------------------------------------------


@dataclass
class LatencyState:
    kb_ns: str
    bl_ns: str
    worker: WorkerProcess
    log: Path
    producer: Any
    consumer: "StandingConsumer"
    seen: int = 0  # log lines already read


class StandingConsumer:
    """The baseline: a plain consumer, subscribed and polling before any message is sent. Notes
    when each record came back (epoch ms) with its timestamp."""

    def __init__(self, cluster: ClusterLike, topic: str):
        self.consumer = clients.consumer(
            cluster, f"baseline.{topic}", **{"auto.offset.reset": "latest", "enable.auto.commit": True}
        )
        self.consumer.subscribe([topic], on_assign=lambda c, ps: self.assigned.set())
        self.assigned = threading.Event()
        self.got: dict[str, tuple[float, int]] = {}
        self.cond = threading.Condition()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="baseline-consumer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None:
                    continue
                now_ms = time.time() * 1000
                if msg.error():
                    if not is_partition_eof(msg):
                        raise RuntimeError(str(msg.error()))
                    continue
                with self.cond:
                    self.got[(msg.key() or b"").decode()] = (now_ms, msg.timestamp()[1])
                    self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            self.error = exc
        finally:
            self.consumer.close()

    def wait_for(self, key: str, timeout: float) -> tuple[float, int]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while key not in self.got:
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"baseline consumer: record {key} not received within {timeout:.0f} s")
                self.cond.wait(min(left, 0.5))
            return self.got.pop(key)

    def close(self) -> None:
        self.stop_flag.set()
        self.thread.join(10)


def send_one(producer: Any, topic: str) -> str:
    """One ExpenseClaim on a new dialog, acknowledged; returns its conversation id."""
    conv, delivery = str(uuid.uuid4()), Delivery()
    producer.produce(topic, key=conv, value=claim_body(100), headers=claim_headers(conv, 0), on_delivery=delivery)
    delivery.check(producer.flush(30))
    return conv


def setup_latency(ctx: BenchContext) -> LatencyState:
    kb_ns, bl_ns = ctx.fresh_namespace("actlat-k"), ctx.fresh_namespace("actlat-b")
    alter_queue_activation(ctx.cluster, kb_ns, QUEUE, status="ON", procedure=LATENCY_PROCEDURE, max_queue_readers=1)
    log = Path(tempfile.mkdtemp(prefix="kbroker-bench-activation-")) / "receives.jsonl"
    log.touch()
    ctx.say(f"starting a worker on {kb_ns}")
    worker = WorkerProcess(ctx, kb_ns, ramp_up=ctx.params.ramp_up, handlers=handlers_for(1), activation_log=log)
    consumer = None
    try:
        worker.wait_ready(QUEUE)
        consumer = StandingConsumer(ctx.cluster, names.queue_topic(bl_ns, QUEUE))
        if not consumer.assigned.wait(60):
            raise RuntimeError("the baseline consumer got no partitions within 60 s")
        state = LatencyState(kb_ns, bl_ns, worker, log, sdk_like_producer(ctx.cluster), consumer)
        # Warm-up, not measured: one activation, one record through the standing consumer.
        ctx.say("warming up: one activation, one baseline record")
        kbroker_latency(ctx, state)
        consumer.wait_for(send_one(state.producer, names.queue_topic(bl_ns, QUEUE)), 30)
        return state
    except BaseException:
        if consumer is not None:
            consumer.close()
        worker.stop()
        raise


def read_receives(state: LatencyState) -> list[dict]:
    lines = state.log.read_bytes().splitlines()
    new = [orjson.loads(x) for x in lines[state.seen :] if x.strip()]
    state.seen = len(lines)
    return new


def kbroker_latency(ctx: BenchContext, state: LatencyState, timeout: float = 30.0) -> dict:
    """One sample: wait for an idle monitor, send a message, wait for the RECEIVE that returned it."""
    wait_monitor(state.worker, QUEUE, idle, 60, "idle monitor (INACTIVE, 0 readers)")
    read_receives(state)  # anything logged before the send is not this sample's
    conv = send_one(state.producer, names.queue_topic(state.kb_ns, QUEUE))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in read_receives(state):
            for c, enqueued in line["messages"]:
                if c == conv:
                    if not line["first"]:
                        raise RuntimeError(
                            "the sample's message was returned by an activation's second "
                            "RECEIVE: the reader was not idle"
                        )
                    return {"ms": line["returned_ms"] - enqueued, "activation": line["activation"]}
        state.worker.check()
        time.sleep(0.005)
    raise RuntimeError(f"no activated RECEIVE returned the message within {timeout:.0f} s: {state.worker.tail()}")


def run_latency(ctx: BenchContext, state: LatencyState, rep: int) -> dict[str, dict]:
    n = ctx.params.samples
    out: dict[str, Any] = {}
    for side in sides(rep):
        lat: list[float] = []
        with ctx.reporter.bar(f"{side}: {n} first-message latencies", n) as advance:
            for _ in range(n):
                if side == "kbroker":
                    lat.append(kbroker_latency(ctx, state)["ms"])
                else:
                    conv = send_one(state.producer, names.queue_topic(state.bl_ns, QUEUE))
                    got_ms, enqueued = state.consumer.wait_for(conv, 30)
                    lat.append(got_ms - enqueued)
                advance(1)
        lat.sort()
        p99 = percentile(lat, 99)
        out[side] = p99
        out[f"{side}_detail"] = {
            "p50_ms": percentile(lat, 50),
            "p99_ms": p99,
            "min_ms": lat[0],
            "max_ms": lat[-1],
            "samples": len(lat),
        }
    out["ramp_up_s"] = ctx.params.ramp_up
    return {"activation-latency": out}


def teardown_latency(_ctx: BenchContext, state: LatencyState) -> None:
    state.consumer.close()
    state.producer.flush(10)
    state.worker.stop()
    shutil.rmtree(state.log.parent, ignore_errors=True)


def _latency_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    out["latency_ms"] = {
        "kbroker": {"p50": k.get("p50_ms"), "p99": k.get("p99_ms")},
        "baseline": {"p50": b.get("p50_ms"), "p99": b.get("p99_ms")},
    }
    out["summary"] = (
        f"p50/p99 ms: activation {k.get('p50_ms')}/{k.get('p99_ms')}, standing consumer "
        f"{b.get('p50_ms')}/{b.get('p99_ms')}; {int(k.get('samples') or 0)} samples per repetition, "
        f"worker ramp-up {out['runs'][0].get('ramp_up_s', '?')} s"
    )


scenario(
    Scenario(
        name="activation-latency",
        description="first message on an idle activated queue -> first RECEIVE of the activated reader",
        rows=(
            Row(
                "activation-latency",
                "ms (p99)",
                f"p99 <= {LATENCY_TARGET_MS:,.0f} ms",
                check=lambda r: r["kbroker"] <= LATENCY_TARGET_MS,
                floor=Floor(3 * LATENCY_TARGET_MS, "kbroker", at_most=True),
                baseline_code="kbroker/bench/scenarios/activation_latency.py:StandingConsumer",
                notes="kbroker: a `kbroker worker` (started once, default 5 s tick, 0.5 s queue watch) on a "
                "namespace whose ExpenseQueue has ACTIVATION ON (max_queue_readers 1, "
                "kbroker.bench.procedures:first_receive). Per sample: wait until the monitor is "
                "INACTIVE with 0 readers, send one ExpenseClaim on a new dialog, latency = the "
                "activated reader's first RECEIVE returning it (time.time() in the worker) - the "
                "record's timestamp. Baseline: a plain confluent-kafka consumer already subscribed "
                "and polling another namespace's ExpenseQueue (no activation, no RECEIVE): what "
                "Kafka delivery alone costs, so the ratio is not only activation's cost but also "
                "kbroker's RECEIVE path. Value = p99 of --samples sends (default 20) per repetition",
                finish=_latency_summary,
            ),
        ),
        run=run_latency,
        setup=setup_latency,
        teardown=teardown_latency,
    )
)
