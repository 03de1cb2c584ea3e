"""`kbroker bench scale`, the queue curve: one namespace of N activated queues (each a topic of
its own, with its consumer group and its monitor) and one `kbroker worker` on it.

Per N: how long `kbroker apply` takes and how many broker partitions the namespace uses; the
worker's start time (process start until every queue's monitor has a row) and its RSS; the tick's
latency (a worker asking for a tick until the TICK event, written after the tick reached every
monitor); the monitors view's staleness (the oldest row's age); and activation's first-message
latency on queues picked at random (a dialog begun and one message sent to an idle queue, until
the reader activated for it returned the message).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml

from kbroker.bench.activation import WorkerProcess, idle, monitor_rows_of, wait_monitor
from kbroker.bench.common import percentile
from kbroker.bench.context import BenchContext
from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions

PROCEDURE = "kbroker.bench.procedures:first_receive"
INITIATOR = "//scale/Initiator"
CONTRACT = "//scale/Contract"
MESSAGE = "//scale/Message"
TICKS = 2  # ticks measured after the worker is up, at least (one each 5 s)
SAMPLE_TIMEOUT = 30.0  # s an activation sample may take before it counts as missed
MAX_MISSED = 3  # samples missed before the point stops sampling


def queue_name(i: int) -> str:
    return f"Q{i:04d}"


def catalog(
    n: int, partitions: int, procedure: str = PROCEDURE, max_readers: int = 1, numbers: list[int] | None = None
) -> dict[str, Any]:
    """Definitions of N activated queues (each with its service) and the initiator's queue; the
    queues are queue_name(i) for i in `numbers` (default: 0 to N-1)."""
    activation = {"status": "ON", "kind": "internal", "procedure": procedure, "max_queue_readers": max_readers}
    chosen = [queue_name(i) for i in (numbers if numbers is not None else range(n))]
    queues = [{"name": "InitiatorQueue", "partitions": 1}] + [
        {"name": q, "partitions": partitions, "activation": activation} for q in chosen
    ]
    services = [{"name": INITIATOR, "queue": "InitiatorQueue"}] + [
        {"name": f"//scale/{q}", "queue": q, "contracts": [CONTRACT]} for q in chosen
    ]
    return {
        "message_types": [{"name": MESSAGE, "validation": "NONE"}],
        "contracts": [{"name": CONTRACT, "messages": [{"type": MESSAGE, "sent_by": "INITIATOR"}]}],
        "queues": queues,
        "services": services,
        "routes": [],
    }


def apply_queues(ctx: BenchContext, n: int, partitions: int, tag: str = "q", **activation: Any) -> tuple[str, float]:
    """A new namespace with N activated queues; (namespace, seconds the apply took)."""
    from kbroker.kafka.catalog.apply import apply_paths

    ns = f"bench-scale-{tag}{n}-{uuid.uuid4().hex[:6]}"
    ctx.namespaces.append(ns)
    folder = Path(tempfile.mkdtemp(prefix="kbroker-scale-"))
    try:
        (folder / "scale.yaml").write_text(yaml.safe_dump(catalog(n, partitions, **activation), sort_keys=False))
        t0 = time.perf_counter()
        apply_paths(ctx.cluster, ns, [folder], timeout=max(30.0, n / 5))
        return ns, time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def partitions_used(ctx: BenchContext, namespace: str) -> tuple[int, int]:
    """(partitions of the namespace's topics, partitions on the whole cluster)."""
    from kbroker.kafka.clients import admin

    topics = admin(ctx.cluster).list_topics(timeout=30).topics
    mine = sum(len(t.partitions) for name, t in topics.items() if name.startswith(names.prefix(namespace)))
    return mine, sum(len(t.partitions) for t in topics.values())


def wait_rows(worker: WorkerProcess, n: int, timeout: float) -> None:
    """Wait until every queue's monitor has a row."""
    deadline = time.monotonic() + timeout
    rows: dict[str, dict] = {}
    while time.monotonic() < deadline:
        worker.check()
        rows = monitor_rows_of(worker)
        if sum(1 for q in rows if q.startswith("Q")) >= n:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{len(rows)} of {n} monitor rows after {timeout:.0f} s: {worker.tail()}")


def tick_latency(value: bytes | None, since_ms: float) -> float | None:
    """ms from a worker's tick request to its TICK event, from one record of the events topic;
    None for any other event, a tick asked for before `since_ms`, or a record not well formed
    (anyone may write the topic)."""
    if not value or b'"TICK"' not in value:
        return None  # other events: passed without parsing
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict) or event.get("event") != "TICK":
        return None
    asked, done = event.get("requested_ms"), event.get("time")
    if not isinstance(asked, int) or not isinstance(done, int) or isinstance(asked, bool) or isinstance(done, bool):
        return None
    return float(done - asked) if since_ms <= asked <= done else None


class TickWatch:
    """The latencies of a namespace's ticks, the events topic read on from where the last look
    ended."""

    def __init__(self, cluster: ClusterLike, namespace: str, since_ms: float):
        self.topic, self.since_ms = names.events_topic(namespace), since_ms
        self.consumer = reading_consumer(cluster, names.reader_group(namespace))
        self.positions: dict[int, int] = {}
        self.latencies: list[float] = []

    def poll(self, timeout: float = 30.0) -> list[float]:
        """Every latency read so far, sorted."""
        if not self.positions:
            self.positions = dict.fromkeys(topic_partitions(self.consumer, self.topic, timeout) or [], 0)
        read = read_partitions(self.consumer, self.topic, self.positions, timeout, on_record=self._take)
        self.positions.update(read.positions)
        return sorted(self.latencies)

    def _take(self, msg: Any) -> None:
        if (ms := tick_latency(msg.value(), self.since_ms)) is not None:
            self.latencies.append(ms)

    def close(self) -> None:
        self.consumer.close()


class ActivationMissed(RuntimeError):
    """No activated reader returned a sample's message within SAMPLE_TIMEOUT."""


def activation_latency(
    worker: WorkerProcess, sender: Any, log: Path, queue: str, seen: int, timeout: float = SAMPLE_TIMEOUT
) -> tuple[float, int]:
    """One sample on `queue` (idle): ms from the SEND's enqueue to the activated RECEIVE
    returning it; and the activation log's lines read so far."""
    wait_monitor(worker, queue, idle, 60, "idle monitor")
    handle = sender.begin_dialog(INITIATOR, f"//scale/{queue}", CONTRACT)
    conversation = sender.endpoints.get(handle).conversation_id
    sender.send(handle, MESSAGE, b"{}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log.read_bytes().splitlines()
        for raw in lines[seen:]:
            line = orjson.loads(raw)
            for c, enqueued in line["messages"]:
                if c == conversation:
                    return line["returned_ms"] - enqueued, len(lines)
        worker.check()
        time.sleep(0.01)
    raise ActivationMissed(f"no activated RECEIVE on {queue} returned the message within {timeout:.0f} s")


def measure(ctx: BenchContext, n: int, *, partitions: int = 4, samples: int = 20) -> dict[str, Any]:
    """One point of the queue curve (see the module docstring)."""
    from kbroker.sdk.broker import Broker

    ctx.say(f"queues: applying {n} activated queues of {partitions} partitions")
    ns, apply_s = apply_queues(ctx, n, partitions)
    ns_partitions, cluster_partitions = partitions_used(ctx, ns)
    log = Path(tempfile.mkdtemp(prefix="kbroker-scale-activation-")) / "receives.jsonl"
    log.touch()
    ctx.say(f"queues: starting a worker on {n} queues")
    t0 = time.perf_counter()
    worker = WorkerProcess(ctx, ns, ramp_up=ctx.params.ramp_up, handlers=4, activation_log=log)
    sender = None
    try:
        wait_rows(worker, n, 120 + n)
        start_s = time.perf_counter() - t0
        ready_ms = time.time() * 1000
        sender = Broker(ctx.cluster, ns)
        latencies: list[float] = []
        missed, seen = 0, 0
        picks = random.Random(n).sample(range(n), min(samples, n))
        with ctx.reporter.bar(f"queues: {len(picks)} activations on {n} queues", len(picks)) as advance:
            for i in picks:
                try:
                    ms, seen = activation_latency(worker, sender, log, queue_name(i), seen)
                    latencies.append(ms)
                except ActivationMissed as exc:
                    ctx.say(f"[yellow]{exc}[/yellow]")
                    missed += 1
                    if missed >= MAX_MISSED:
                        break
                advance(1)
        ticks: list[float] = []
        watch = TickWatch(ctx.cluster, ns, ready_ms)
        try:
            deadline = time.monotonic() + 60
            while len(ticks) < TICKS and time.monotonic() < deadline:  # ticks of the started worker
                time.sleep(1.0)
                ticks = watch.poll()
        finally:
            watch.close()
        rows = monitor_rows_of(worker)
        ages = [r["age"] for q, r in rows.items() if q.startswith("Q") and r.get("age") is not None]
        rss = psutil.Process(worker.proc.pid).memory_info().rss / 2**20
        latencies.sort()
        return {
            "queues": n,
            "partitions_per_queue": partitions,
            "apply_s": round(apply_s, 2),
            "namespace_partitions": ns_partitions,
            "cluster_partitions": cluster_partitions,
            "worker_start_s": round(start_s, 2),
            "worker_rss_mb": round(rss, 1),
            "tick_ms": {"p50": percentile(ticks, 50), "max": ticks[-1] if ticks else None, "ticks": len(ticks)},
            "view_age_s": {"max": max(ages) if ages else None, "p50": percentile(sorted(ages), 50)},
            "activation_ms": {
                "p50": percentile(latencies, 50),
                "p99": percentile(latencies, 99),
                "samples": len(latencies),
                "missed": missed,
                "timeout_s": SAMPLE_TIMEOUT,
            },
        }
    finally:
        if sender is not None:
            sender.close()
        worker.stop()
        shutil.rmtree(log.parent, ignore_errors=True)
