"""The activation-drain scenario: the time to drain a standing backlog once activation is turned
on (ALTER QUEUE ... ACTIVATION ON, max_queue_readers = K, the worker's ramp-up), against a fixed
pool of K threads running the same procedure, all started at once."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kbroker.bench import procedures
from kbroker.bench.activation import WorkerProcess, handlers_for, idle, wait_monitor
from kbroker.bench.common import (
    QUEUE,
    claim_body,
    join_all,
    new_conversations,
    produce_dialogs,
    side_by_side,
)
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.core import names
from kbroker.kafka import clients
from kbroker.kafka.baseline import (
    committed_offsets,
    end_offsets,
)
from kbroker.kafka.queue_views import alter_queue_activation
from kbroker.kafka.snapshot import topic_partitions
from kbroker.sdk.broker import Broker

DRAIN_PROCEDURE = "kbroker.bench.procedures:drain"
DRAIN_RATIO_TARGET = 1.2
POLL = 0.1  # how often the committed offsets are read


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
    alter_queue_activation(
        ctx.cluster, kb_ns, QUEUE, status="ON", procedure=DRAIN_PROCEDURE, max_queue_readers=p.max_readers
    )
    ctx.say(f"starting a worker on {kb_ns} (ramp-up {p.ramp_up:g} s)")
    worker = WorkerProcess(ctx, kb_ns, ramp_up=p.ramp_up, handlers=handlers_for(p.max_readers))
    try:
        worker.wait_ready(QUEUE)
        alter_queue_activation(ctx.cluster, kb_ns, QUEUE, status="OFF")
        wait_monitor(worker, QUEUE, lambda r: r["activation"] == "OFF", 60, "ACTIVATION OFF")
    except BaseException:
        worker.stop()
        raise
    c = max(1, min(p.conversations, p.drain_messages))
    return DrainState(kb_ns, bl_ns, worker, Broker(ctx.cluster, bl_ns), new_conversations(c))


class CommitWatch:
    """Reads a queue group's committed offsets until they reach the given ends."""

    def __init__(self, ctx: BenchContext, namespace: str, queue: str = QUEUE):
        self.topic = names.queue_topic(namespace, queue)
        self.consumer = clients.consumer(ctx.cluster, names.queue_group(namespace, queue))
        partitions = topic_partitions(self.consumer, self.topic, 30)
        if partitions is None:
            raise RuntimeError(f"topic {self.topic} does not exist")
        self.partitions = partitions

    def ends(self) -> dict[int, int]:
        """partition -> end offset."""
        return end_offsets(self.consumer, self.topic, self.partitions, 30)

    def done(self) -> int:
        """Messages committed: the sum of committed offsets (no commit yet = 0)."""
        return sum(committed_offsets(self.consumer, self.topic, self.partitions, 30).values())

    def close(self) -> None:
        self.consumer.close()


def measure_drain(ctx: BenchContext, state: DrainState, side: str) -> dict:
    p = ctx.params
    m, k = p.drain_messages, p.max_readers
    ns = state.kb_ns if side == "kbroker" else state.bl_ns
    produce_dialogs(
        ctx,
        names.queue_topic(ns, QUEUE),
        state.conversations,
        0,
        claim_body(p.body_bytes),
        f"{side}: backlog of {m:,} messages on {len(state.conversations):,} dialogs",
        total=m,
    )
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
        with ctx.reporter.bar(
            f"{side}: draining with "
            + (f"activation (max_queue_readers {k})" if side == "kbroker" else f"{k} readers"),
            m,
        ) as advance:
            t0 = time.perf_counter()
            if side == "kbroker":
                alter_queue_activation(ctx.cluster, ns, QUEUE, status="ON")
                alter_s = time.perf_counter() - t0
            else:

                def work() -> None:
                    try:
                        procedures.drain(state.baseline, QUEUE)
                    except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
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
            alter_queue_activation(ctx.cluster, ns, QUEUE, status="OFF")
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
    row = side_by_side(rep, lambda side: measure_drain(ctx, state, side))
    row["messages"], row["max_queue_readers"], row["ramp_up_s"] = (
        ctx.params.drain_messages,
        ctx.params.max_readers,
        ctx.params.ramp_up,
    )
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
    out["summary"] = (
        f"{r0.get('messages'):,} messages, max_queue_readers {r0.get('max_queue_readers')}, "
        f"worker ramp-up {r0.get('ramp_up_s'):g} s; msg/s: activation {k.get('msg_per_s')}, "
        f"fixed pool {b.get('msg_per_s')}"
    )


scenario(
    Scenario(
        name="activation-drain",
        description="drain a standing backlog: activation (ramping up to max_queue_readers) vs a fixed pool",
        rows=(
            Row(
                "activation-drain",
                "s",
                f"ratio <= {DRAIN_RATIO_TARGET}",
                check=lambda r: r["ratio"] <= DRAIN_RATIO_TARGET,
                floor=Floor(2.5 * DRAIN_RATIO_TARGET, at_most=True),
                baseline_code="kbroker/bench/scenarios/activation_drain.py:measure_drain (a fixed pool of threads); "
                "kbroker/bench/procedures.py:drain",
                notes="a backlog of --drain-messages (default 100,000) ExpenseClaims over --conversations "
                "dialogs; kbroker: a running `kbroker worker` (--ramp-up, default 5 s as in SSB), "
                "timed from ALTER QUEUE ... ACTIVATION ON (max_queue_readers = --max-readers, "
                "default 4) until the queue group's committed offsets reach the end; baseline: "
                "--max-readers threads sharing one Broker, all started at once, running the same "
                "procedure (kbroker.bench.procedures:drain: RECEIVE TOP (100) in a transaction of "
                "its own until a RECEIVE waits 1 s for nothing). Ratio kbroker/baseline (lower is "
                "better)",
                finish=_drain_summary,
            ),
        ),
        run=run_drain,
        setup=setup_drain,
        teardown=teardown_drain,
    )
)
