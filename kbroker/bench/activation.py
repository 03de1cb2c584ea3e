"""The activation scenarios: a real `kbroker worker` (a subprocess, started once per scenario)
activating the procedures of kbroker/bench/procedures.py on ExpenseQueue.

activation-latency  from a message arriving on an idle queue (monitor INACTIVE, no reader running)
                    to the first RECEIVE of the reader it activated returning it; p50 and p99.
                    Baseline: a plain confluent-kafka consumer already polling its queue.
activation-drain    time to drain a standing backlog once activation is turned on (ALTER QUEUE
                    ... ACTIVATION ON, max_queue_readers = K, the worker's ramp-up), vs a fixed
                    pool of K threads running the same procedure, all started at once.

Each side has a namespace of its own (topics/samples applied), so no consumer group is shared:
the worker's readers only ever see the kbroker side's queue.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kbroker.bench import procedures
from kbroker.bench.harness import BenchContext, Row, Scenario, _free_port, scenario
from kbroker.bench.scenarios import (
    QUEUE,
    Delivery,
    _percentile,
    claim_body,
    claim_headers,
    join_all,
    new_conversations,
    produce_dialogs,
    sdk_like_producer,
    sides,
)
from kbroker.config import KAFKA_LOG
from kbroker.core import names
from kbroker.errors import BrokerUnavailableError
from kbroker.kafka.queues import alter_queue_activation
from kbroker.sdk.broker import Broker

LATENCY_PROCEDURE = "kbroker.bench.procedures:first_receive"
DRAIN_PROCEDURE = "kbroker.bench.procedures:drain"
LATENCY_TARGET_MS = 1_000.0
DRAIN_RATIO_TARGET = 1.2
POLL = 0.1  # activation-drain: how often the committed offsets are read


# --- the worker -------------------------------------------------------------------------------


class WorkerProcess:
    """`python -m kbroker worker` on one namespace, with its log in a temporary file."""

    def __init__(self, ctx: BenchContext, namespace: str, *, ramp_up: float, handlers: int,
                 activation_log: Path | None = None):
        self.ctx, self.namespace, self.ramp_up = ctx, namespace, ramp_up
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="kbroker-bench-worker-"))
        self.log = self.dir / "worker.log"
        root = str(Path(__file__).resolve().parents[2])  # this checkout's kbroker, not another one
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        if activation_log is not None:
            env[procedures.LOG_ENV] = str(activation_log)
        self.cmd = [sys.executable, "-m", "kbroker", "worker", "--bootstrap", ctx.bootstrap, "--namespace",
                    namespace, "--web-port", str(self.port), "--ramp-up", str(ramp_up), "--handlers",
                    str(handlers), "--loglevel", "warning"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)

    def tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.proc.returncode}: {self.tail()}")

    def wait_ready(self, queue: str, timeout: float = 120.0) -> None:
        """Its HTTP API answers and the queue's monitor has a row (the worker watches the queue)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/tasks/", timeout=2) as r:
                    orjson.loads(r.read())
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"the worker did not answer within {timeout:.0f} s: {self.tail()}")
        wait_monitor(self, queue, lambda row: True, max(1.0, deadline - time.monotonic()), "its first monitor row")

    def running_tasks(self) -> int:
        """Activated readers running now (the worker's /tasks/); 0 when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/tasks/", timeout=2) as r:
                return len(orjson.loads(r.read())["tasks"])
        except (OSError, ValueError, KeyError):
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def monitor_row(bootstrap: str, namespace: str, queue: str) -> dict | None:
    from kbroker.worker.views import monitor_rows

    try:
        return next((r for r in monitor_rows(bootstrap, namespace, timeout=5) if r["queue"] == queue), None)
    except BrokerUnavailableError:  # a changelog partition without a leader yet: ask again
        return None


def wait_monitor(worker: WorkerProcess, queue: str, pred, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        worker.check()
        row = monitor_row(worker.ctx.bootstrap, worker.namespace, queue)
        if row is not None and pred(row):
            return row
        time.sleep(0.1)
    raise RuntimeError(f"the worker's monitor of {queue}: no {what} within {timeout:.0f} s (last row: {row})")


def idle(row: dict) -> bool:
    return row["readers"] == 0 and row["state"] == "INACTIVE"


def _handlers(readers: int) -> int:
    return max(readers + 2, 2 * (os.cpu_count() or 1))


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

    def __init__(self, bootstrap: str, topic: str):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG,
                                  "group.id": f"baseline.{topic}", "auto.offset.reset": "latest",
                                  "enable.auto.commit": True})
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
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(msg.error().str())
                    continue
                with self.cond:
                    self.got[msg.key().decode()] = (now_ms, msg.timestamp()[1])
                    self.cond.notify_all()
        except BaseException as exc:
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
    producer.produce(topic, key=conv, value=claim_body(100), headers=claim_headers(conv, 0),
                     on_delivery=delivery)
    delivery.check(producer.flush(30))
    return conv


def setup_latency(ctx: BenchContext) -> LatencyState:
    kb_ns, bl_ns = ctx.fresh_namespace("actlat-k"), ctx.fresh_namespace("actlat-b")
    alter_queue_activation(ctx.bootstrap, kb_ns, QUEUE, status="ON", procedure=LATENCY_PROCEDURE,
                           max_queue_readers=1)
    log = Path(tempfile.mkdtemp(prefix="kbroker-bench-activation-")) / "receives.jsonl"
    log.touch()
    ctx.say(f"starting a worker on {kb_ns}")
    worker = WorkerProcess(ctx, kb_ns, ramp_up=ctx.params.ramp_up, handlers=_handlers(1), activation_log=log)
    consumer = None
    try:
        worker.wait_ready(QUEUE)
        consumer = StandingConsumer(ctx.bootstrap, names.queue_topic(bl_ns, QUEUE))
        if not consumer.assigned.wait(60):
            raise RuntimeError("the baseline consumer got no partitions within 60 s")
        state = LatencyState(kb_ns, bl_ns, worker, log, sdk_like_producer(ctx.bootstrap), consumer)
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
    new = [orjson.loads(x) for x in lines[state.seen:] if x.strip()]
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
                        raise RuntimeError("the sample's message was returned by an activation's second "
                                           "RECEIVE: the reader was not idle")
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
        p99 = _percentile(lat, 99)
        out[side] = p99
        out[f"{side}_detail"] = {"p50_ms": _percentile(lat, 50), "p99_ms": p99, "min_ms": lat[0],
                                 "max_ms": lat[-1], "samples": len(lat)}
    out["ramp_up_s"] = ctx.params.ramp_up
    return {"activation-latency": out}


def teardown_latency(_ctx: BenchContext, state: LatencyState) -> None:
    state.consumer.close()
    state.producer.flush(10)
    state.worker.stop()
    shutil.rmtree(state.log.parent, ignore_errors=True)


def _latency_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    out["latency_ms"] = {"kbroker": {"p50": k.get("p50_ms"), "p99": k.get("p99_ms")},
                         "baseline": {"p50": b.get("p50_ms"), "p99": b.get("p99_ms")}}
    out["summary"] = (f"p50/p99 ms: activation {k.get('p50_ms')}/{k.get('p99_ms')}, standing consumer "
                      f"{b.get('p50_ms')}/{b.get('p99_ms')}; {int(k.get('samples') or 0)} samples per repetition, "
                      f"worker ramp-up {out['runs'][0].get('ramp_up_s', '?')} s")


scenario(Scenario(
    name="activation-latency",
    description="first message on an idle activated queue -> first RECEIVE of the activated reader",
    rows=(Row("activation-latency", "ms (p99)", f"p99 <= {LATENCY_TARGET_MS:,.0f} ms",
              check=lambda r: r["kbroker"] <= LATENCY_TARGET_MS,
              notes="kbroker: a `kbroker worker` (started once, default 5 s tick, 0.5 s queue watch) on a "
                    "namespace whose ExpenseQueue has ACTIVATION ON (max_queue_readers 1, "
                    "kbroker.bench.procedures:first_receive). Per sample: wait until the monitor is "
                    "INACTIVE with 0 readers, send one ExpenseClaim on a new dialog, latency = the "
                    "activated reader's first RECEIVE returning it (time.time() in the worker) - the "
                    "record's timestamp. Baseline: a plain confluent-kafka consumer already subscribed "
                    "and polling another namespace's ExpenseQueue (no activation, no RECEIVE): what "
                    "Kafka delivery alone costs, so the ratio is not only activation's cost but also "
                    "kbroker's RECEIVE path. Value = p99 of --samples sends (default 20) per repetition",
              finish=_latency_summary),),
    run=run_latency,
    setup=setup_latency,
    teardown=teardown_latency,
))


# --- activation-drain ---------------------------------------------------------------------------


@dataclass
class DrainState:
    kb_ns: str
    bl_ns: str
    worker: WorkerProcess
    baseline: Broker
    conversations: list[str] = field(default_factory=list)


def setup_drain(ctx: BenchContext) -> DrainState:
    p = ctx.params
    kb_ns, bl_ns = ctx.fresh_namespace("actdrain-k"), ctx.fresh_namespace("actdrain-b")
    # ON on the empty queue so the worker watches it from the start, then OFF until each measurement.
    alter_queue_activation(ctx.bootstrap, kb_ns, QUEUE, status="ON", procedure=DRAIN_PROCEDURE,
                           max_queue_readers=p.max_readers)
    ctx.say(f"starting a worker on {kb_ns} (ramp-up {p.ramp_up:g} s)")
    worker = WorkerProcess(ctx, kb_ns, ramp_up=p.ramp_up, handlers=_handlers(p.max_readers))
    try:
        worker.wait_ready(QUEUE)
        alter_queue_activation(ctx.bootstrap, kb_ns, QUEUE, status="OFF")
        wait_monitor(worker, QUEUE, lambda r: r["activation"] == "OFF", 60, "ACTIVATION OFF")
    except BaseException:
        worker.stop()
        raise
    c = max(1, min(p.conversations, p.drain_messages))
    return DrainState(kb_ns, bl_ns, worker, Broker(ctx.bootstrap, bl_ns), new_conversations(c))


class CommitWatch:
    """Reads the queue group's committed offsets until they reach the given ends."""

    def __init__(self, ctx: BenchContext, namespace: str):
        self.topic = names.queue_topic(namespace, QUEUE)
        self.consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "logger": KAFKA_LOG,
                                  "group.id": names.queue_group(namespace, QUEUE), "enable.auto.commit": False})
        parts = self.consumer.list_topics(self.topic, timeout=30).topics[self.topic].partitions
        self.tps = [TopicPartition(self.topic, p) for p in sorted(parts)]

    def ends(self) -> dict[int, int]:
        return {tp.partition: self.consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in self.tps}

    def done(self) -> int:
        """Messages committed: the sum of committed offsets (no commit yet = 0)."""
        return sum(max(tp.offset, 0) for tp in self.consumer.committed(self.tps, timeout=30))

    def close(self) -> None:
        self.consumer.close()


def measure_drain(ctx: BenchContext, state: DrainState, side: str) -> dict:
    p = ctx.params
    m, k = p.drain_messages, p.max_readers
    ns = state.kb_ns if side == "kbroker" else state.bl_ns
    produce_dialogs(ctx, names.queue_topic(ns, QUEUE), state.conversations, 0, claim_body(p.body_bytes),
                    f"{side}: backlog of {m:,} messages on {len(state.conversations):,} dialogs", total=m)
    watch = CommitWatch(ctx, ns)
    try:
        ends = watch.ends()
        target, start = sum(ends.values()), watch.done()
        if target - start < m:
            raise RuntimeError(f"{side}: the queue holds {target - start:,} uncommitted records, not {m:,}")
        deadline = 120 + m / 200  # generous: 200 msg/s
        threads: list[threading.Thread] = []
        errors: list[BaseException] = []
        if side == "kbroker":
            # The standing backlog has reached the monitor's counts (the leader's 0.5 s watch).
            wait_monitor(state.worker, QUEUE, lambda r: r["backlog"] > 0, 30, "backlog count")
        gc.collect()
        with ctx.reporter.bar(f"{side}: draining with " + (f"activation (max_queue_readers {k})" if side == "kbroker"
                                                         else f"{k} readers"), m) as advance:
            t0 = time.perf_counter()
            if side == "kbroker":
                alter_queue_activation(ctx.bootstrap, ns, QUEUE, status="ON")
                alter_s = time.perf_counter() - t0
            else:
                def work() -> None:
                    try:
                        procedures.drain(state.baseline, QUEUE)
                    except BaseException as exc:
                        errors.append(exc)

                threads = [threading.Thread(target=work, name=f"bench-drain-{i}", daemon=True) for i in range(k)]
                for t in threads:
                    t.start()
            last = start
            reached: dict[int, float] = {}  # kbroker: running readers -> when first seen
            while True:
                done = watch.done()
                now = time.perf_counter()
                advance(done - last)
                last = done
                if done >= target:
                    elapsed = now - t0
                    break
                if errors:
                    raise errors[0]
                if side == "kbroker":
                    state.worker.check()
                    n = state.worker.running_tasks()
                    for i in range(1, n + 1):
                        reached.setdefault(i, now - t0)
                if now - t0 > deadline:
                    raise RuntimeError(f"{side}: {done - start:,} of {m:,} messages drained after {deadline:.0f} s")
                time.sleep(POLL)
        detail: dict[str, Any] = {"seconds": elapsed, "msg_per_s": m / elapsed}
        if side == "kbroker":
            detail["alter_s"] = alter_s
            detail["readers_at_s"] = {str(n): round(t, 2) for n, t in sorted(reached.items())}
            wait_monitor(state.worker, QUEUE, idle, 60, "idle monitor after the drain")
            alter_queue_activation(ctx.bootstrap, ns, QUEUE, status="OFF")
            wait_monitor(state.worker, QUEUE, lambda r: r["activation"] == "OFF", 60, "ACTIVATION OFF")
        else:
            if not join_all(threads, 30):
                ctx.say("[yellow]baseline: drain threads did not stop[/yellow]")
            if errors:
                raise errors[0]
        return {"value": elapsed, "detail": detail}
    finally:
        watch.close()


def run_drain(ctx: BenchContext, state: DrainState, rep: int) -> dict[str, dict]:
    row: dict[str, Any] = {}
    for side in sides(rep):
        r = measure_drain(ctx, state, side)
        row[side], row[f"{side}_detail"] = r["value"], r["detail"]
    row["messages"], row["max_queue_readers"], row["ramp_up_s"] = (
        ctx.params.drain_messages, ctx.params.max_readers, ctx.params.ramp_up)
    return {"activation-drain": row}


def teardown_drain(_ctx: BenchContext, state: DrainState) -> None:
    try:
        state.baseline.close()
    finally:
        state.worker.stop()


def _drain_summary(out: dict) -> None:
    runs = out["runs"]
    if not runs:
        return
    r0 = runs[0]
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    out["summary"] = (f"{r0.get('messages'):,} messages, max_queue_readers {r0.get('max_queue_readers')}, "
                      f"worker ramp-up {r0.get('ramp_up_s'):g} s; msg/s: activation {k.get('msg_per_s')}, "
                      f"fixed pool {b.get('msg_per_s')}")


scenario(Scenario(
    name="activation-drain",
    description="drain a standing backlog: activation (ramping up to max_queue_readers) vs a fixed pool",
    rows=(Row("activation-drain", "s", f"ratio <= {DRAIN_RATIO_TARGET}",
              check=lambda r: r["ratio"] <= DRAIN_RATIO_TARGET,
              notes="a backlog of --drain-messages (default 100,000) ExpenseClaims over --conversations "
                    "dialogs; kbroker: a running `kbroker worker` (--ramp-up, default 5 s as in SSB), "
                    "timed from ALTER QUEUE ... ACTIVATION ON (max_queue_readers = --max-readers, "
                    "default 4) until the queue group's committed offsets reach the end; baseline: "
                    "--max-readers threads sharing one Broker, all started at once, running the same "
                    "procedure (kbroker.bench.procedures:drain: RECEIVE TOP (100) in a transaction of "
                    "its own until a RECEIVE waits 1 s for nothing). Ratio kbroker/baseline (lower is "
                    "better)",
              finish=_drain_summary),),
    run=run_drain,
    setup=setup_drain,
    teardown=teardown_drain,
))

