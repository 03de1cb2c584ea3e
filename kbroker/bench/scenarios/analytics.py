"""The analytics scenarios: how many events per second the Spark job keeps up with, against what
kbroker's own SEND path produces in the same run, and how long after a message crosses its stale
threshold the analytics topic says so."""

from __future__ import annotations

import time
from typing import Any

from kbroker.bench.activation import WorkerProcess
from kbroker.bench.common import claim_body, percentile
from kbroker.bench.harness import BASELINE_OVER_KBROKER, BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.scenarios.send import KBrokerSender
from kbroker.worker.web.web_client import get

TRIGGER = 2.0  # the job's default trigger: the stale-delay target is two of them
STALE_AFTER = 3.0  # the job's threshold for the bench queue (it has no stale_after of its own)
STALE_SAMPLES = 20  # messages whose crossing is timed, per repetition
QUEUE = "ExpenseQueue"
BATCH = 20_000  # the job's default --max-per-batch


def setup_spark(ctx: BenchContext) -> Any:
    from kbroker.analytics.session import spark_session

    ctx.say("starting a local Spark session (local[2])")
    return spark_session("local[2]", {"spark.driver.memory": "1g"})


def teardown_spark(_ctx: BenchContext, spark: Any) -> None:
    spark.stop()


def start_job(ctx: BenchContext, spark: Any, ns: str, **settings: Any) -> Any:
    import tempfile
    from pathlib import Path

    from kbroker.analytics.job import AnalyticsJob, JobSettings

    home = Path(tempfile.mkdtemp(prefix="kbroker-bench-analytics-"))
    s = JobSettings(
        cluster=ctx.cluster,
        namespace=ns,
        checkpoint=home / "checkpoint",
        history=home / "history",
        **{"trigger": TRIGGER, "stale_after": STALE_AFTER, **settings},
    )
    return AnalyticsJob(s, spark).start()


def keep_up(ctx: BenchContext, spark: Any, batch: int = BATCH) -> dict[str, Any]:
    """kbroker: events/s the job processes a backlog of SENDs at; baselines: the rates of the two
    SEND paths that wrote them (one SEND at a time, acknowledged; many in one transaction)."""
    p = ctx.params
    # Five batches' worth: the first batch (the query's warm-up: consumers, code generation) is
    # left out of the rate, the rest is the steady state a running job reads a burst at.
    n, c = 5 * batch, max(1, min(p.conversations, 5 * batch))
    ns = ctx.fresh_namespace("analytics")
    sender = KBrokerSender(ctx, ns, c, claim_body(p.body_bytes))
    try:  # both SEND paths, into the backlog the job then reads
        sent = sender.run(batch, pipelined=False)
        pipelined = sender.run(n - batch, pipelined=True)
    finally:
        sender.close()
    job = start_job(ctx, spark, ns, trigger=0.5, max_per_batch=batch)
    try:
        deadline = time.monotonic() + 300
        with ctx.reporter.bar("analytics job reading the SENDs", n) as advance:
            done = 0
            while job.rows < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the analytics job read {job.rows:,} of {n:,} records in 300 s")
                advance(job.rows - done)
                done = job.rows
                time.sleep(0.2)
            advance(n - done)
        batches = [b for b in job.recent if b["rows"]][1:]
        rows = sum(b["rows"] for b in batches)
        seconds = batches[-1]["started"] + batches[-1]["seconds"] - batches[0]["started"]
        busy = sum(b["seconds"] for b in batches)
    finally:
        job.stop()
    detail = {"batches": len(batches), "rows": rows, "seconds": seconds, "busy_rate": rows / busy if busy else None}
    return {
        "analytics-throughput": {
            "kbroker": rows / seconds,
            "baseline": sent["value"],
            "kbroker_detail": detail,
            "baseline_detail": {"messages": batch, **sent["detail"]},
        },
        "analytics-throughput-pipelined": {
            "kbroker": rows / seconds,
            "baseline": pipelined["value"],
            "kbroker_detail": detail,
            "baseline_detail": {"messages": n - batch, **pipelined["detail"]},
        },
    }


def stale_delay(ctx: BenchContext, spark: Any) -> dict[str, Any]:
    """kbroker: p99 seconds from a message crossing its threshold to the analytics topic showing
    it; baseline: the trigger interval (the least a micro-batch job can do)."""
    from kbroker.bench.common import CLAIM, CONTRACT, EMP, EXP
    from kbroker.kafka.analytics.store import AnalyticsFollower
    from kbroker.sdk.broker import Broker

    ns = ctx.fresh_namespace("stale")
    worker = WorkerProcess(ctx, ns, ramp_up=5.0, handlers=1)
    follower = AnalyticsFollower(ctx.cluster, ns)
    broker = Broker(ctx.cluster, ns)
    job = None
    try:
        wait_http(worker, 120)
        job = start_job(ctx, spark, ns)
        while job.batches < 1:
            time.sleep(0.2)
        handle = broker.begin_dialog(EMP, EXP, CONTRACT)
        crossings = []
        for _ in range(STALE_SAMPLES):
            broker.send(handle, CLAIM, claim_body(ctx.params.body_bytes))
            crossings.append(time.time() + STALE_AFTER)
            time.sleep(0.25)
        seen: list[float] = []
        deadline = time.monotonic() + STALE_AFTER + 60
        with ctx.reporter.bar("messages seen stale", STALE_SAMPLES) as advance:
            while len(seen) < STALE_SAMPLES and time.monotonic() < deadline:
                follower.poll(0.1)
                row = follower.latest().get(QUEUE)
                stale = row["stale"]["queue"] if row else 0
                while len(seen) < min(stale, STALE_SAMPLES):
                    seen.append(time.time())
                    advance(1)
        if len(seen) < STALE_SAMPLES:
            raise RuntimeError(f"{len(seen)} of {STALE_SAMPLES} messages were reported stale in time")
        delays = [max(0.0, s - c) for s, c in zip(seen, crossings)]
    finally:
        if job is not None:
            job.stop()
        follower.close()
        broker.close()
        worker.stop()
    return {
        "kbroker": percentile(delays, 99),
        "baseline": TRIGGER,
        "kbroker_detail": {"p50": percentile(delays, 50), "max": max(delays)},
        "baseline_detail": {"trigger_s": TRIGGER},
    }


def wait_http(worker: WorkerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.check()
        try:
            get(f"http://127.0.0.1:{worker.port}", "/tasks/", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the worker did not answer in {timeout:g} s: {worker.tail()}")


def run_analytics(ctx: BenchContext, spark: Any, rep: int) -> dict[str, dict]:
    return {**keep_up(ctx, spark), "analytics-stale-delay": stale_delay(ctx, spark)}


scenario(
    Scenario(
        name="analytics",
        description="the Spark analytics job: events/s it keeps up with, and its stale-report delay",
        rows=(
            Row(
                "analytics-throughput",
                "events/s",
                "kbroker >= baseline (never behind SEND)",
                check=lambda r: r["kbroker"] >= r["baseline"],
                floor=Floor(0.5),
                baseline_code="kbroker/bench/scenarios/send.py:KBrokerSender.run (one SEND at a time)",
                notes="kbroker: queue records per second the job (local[2], 0.5 s trigger, 20,000 records a batch) "
                "reads, projects, counts and writes from a backlog of 100,000 SENDs, after its first batch "
                "(warm-up); baseline: the rate of the first 20,000 of those SENDs, one Broker.send at a "
                "time (each acknowledged: the SDK's SEND), in the same repetition",
            ),
            Row(
                "analytics-throughput-pipelined",
                "events/s",
                "kbroker >= baseline",
                check=lambda r: r["kbroker"] >= r["baseline"],
                floor=Floor(0.4),
                baseline_code="kbroker/bench/scenarios/send.py:KBrokerSender.run (pipelined, one transaction)",
                notes="the same job figure against the other 80,000 SENDs' rate, made in one transaction (the "
                "fastest one process can SEND)",
            ),
            Row(
                "analytics-stale-delay",
                "s",
                f"p99 <= {2 * TRIGGER:g} s (2 triggers)",
                check=lambda r: r["kbroker"] <= 2 * TRIGGER,
                ratio=BASELINE_OVER_KBROKER,
                floor=Floor(4 * TRIGGER, "kbroker", at_most=True),
                baseline_code="kbroker/bench/scenarios/analytics.py:TRIGGER (the trigger interval, not measured)",
                notes=f"kbroker: p99 over {STALE_SAMPLES} messages of (when the analytics topic first counts the "
                f"message stale - when it crossed its {STALE_AFTER:g} s threshold), trigger {TRIGGER:g} s, a worker "
                "publishing progress; baseline: the trigger interval itself",
            ),
        ),
        run=run_analytics,
        setup=setup_spark,
        teardown=teardown_spark,
        not_quick="a local Spark session takes most of a minute to start on 2 cores, and the job's throughput is "
        "measured over a fixed 100,000 SENDs (five of its 20,000-record batches)",
    )
)
