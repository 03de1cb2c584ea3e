"""The backlog-rss scenario: the peak RSS of a process receiving from a queue with a large
backlog, against a process that only connects."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson
import psutil

from kbroker.bench.common import (
    QUEUE,
    claim_body,
    new_conversations,
    produce_dialogs,
    side_by_side,
)
from kbroker.bench.harness import (
    BenchContext,
    Floor,
    Row,
    Scenario,
    scenario,
)
from kbroker.core import names

RSS_RECEIVE = 1_000  # backlog-rss: messages the child receives
# backlog-rss: how far above the connect-only child the receiving child may go and still count as
# bounded. The receiver buffers at most 20,000 records before pausing its partitions, and
# librdkafka pre-fetches at most queued.max.messages.kbytes (16 MiB) into its queue; with 100-byte
# bodies and ~450 bytes of headers both stay below this, whatever the backlog.
RSS_BOUND_MB = 256


# --- backlog-rss ----------------------------------------------------------------------------------

# The child process: only kbroker is imported. "kbroker" receives COUNT messages; "baseline" only
# connects. Prints one JSON line with its peak RSS (the kernel's high-water mark, VmHWM).
CHILD_START = r"""
import json, resource, sys, time
mode, cluster, namespace, queue, count = sys.argv[1:6]
count = int(count)
import kbroker
t0 = time.monotonic()
broker = kbroker.connect(cluster, namespace)
received, first = 0, None
if mode == "kbroker":
    deadline = time.monotonic() + 240
    while received < count and time.monotonic() < deadline:
        got = len(broker.receive(queue, top=100, wait=5))
        if not got:
            break  # the queue is empty: the parent reports the shortfall
        if first is None:
            first = time.monotonic() - t0
        received += got
"""

# The child's own high-water mark, pasted into every child script.
PEAK_RSS = r"""
def peak_rss_kb():
    # VmHWM: the high-water mark of this process's own memory. Not getrusage's ru_maxrss, which
    # Linux carries over from the parent that forked this process (the harness's own size).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""

CHILD_END = r"""
rss_kb = peak_rss_kb()
broker.close()
print(json.dumps({"peak_rss_kb": rss_kb, "received": received, "seconds": time.monotonic() - t0,
                  "first_message_s": first}))
"""
CHILD = CHILD_START + PEAK_RSS + CHILD_END


def run_rss_child(script: str, args: list[str], mode: str, timeout: float = 300) -> dict[str, Any]:
    """Run a child script that prints one JSON line with its `peak_rss_kb` (PEAK_RSS), sampling
    its RSS with psutil as a cross-check of that high-water mark. Returns {"value": peak MB,
    "detail": the rest of the line and the sampled peak}, the shape side_by_side takes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, mode, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    sampled = 0
    try:
        ps = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                sampled = max(sampled, ps.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)
        if proc.poll() is None:
            raise RuntimeError(f"the {mode} child did not finish within {timeout:g} s")
        out, err = proc.communicate(timeout=30)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        tail = " | ".join(line for line in err.strip().splitlines()[-3:])
        raise RuntimeError(f"the {mode} child exited with {proc.returncode}: {tail}")
    result = orjson.loads(out.strip().splitlines()[-1])
    peak_kb = result.pop("peak_rss_kb")
    return {"value": peak_kb / 1024, "detail": {**result, "sampled_peak_mb": sampled / 2**20}}


def run_child(ctx: BenchContext, mode: str, namespace: str, count: int) -> dict[str, Any]:
    """The backlog child ("kbroker" receives `count` messages, "baseline" only connects)."""
    m = run_rss_child(CHILD, [ctx.cluster.bootstrap, namespace, QUEUE, str(count)], mode)
    if mode == "kbroker" and m["detail"]["received"] < count:
        raise RuntimeError(f"the kbroker child received {m['detail']['received']} of {count} messages")
    return m


@dataclass
class Backlog:
    namespace: str
    messages: int
    bytes: int


def setup_backlog(ctx: BenchContext) -> Backlog:
    p = ctx.params
    ns = ctx.fresh_namespace("rss")
    c = max(1, min(p.conversations, p.backlog))
    size = produce_dialogs(
        ctx,
        names.queue_topic(ns, QUEUE),
        new_conversations(c),
        0,
        claim_body(p.body_bytes),
        f"backlog of {p.backlog:,} messages",
        total=p.backlog,
    )
    return Backlog(ns, p.backlog, size)


def run_backlog_rss(ctx: BenchContext, backlog: Backlog, rep: int) -> dict[str, dict]:
    # Every kbroker child takes its messages off the same backlog (a RECEIVE may return up to 99
    # more than asked): leave enough for each repetition.
    count = max(1, min(RSS_RECEIVE, backlog.messages // (2 * ctx.params.repeat)))

    def measure(side: str) -> dict[str, Any]:
        ctx.say(f"{side} child: " + (f"receiving {count:,} messages" if side == "kbroker" else "connecting"))
        return run_child(ctx, side, backlog.namespace, count)

    row = side_by_side(rep, measure)
    row["backlog_messages"], row["backlog_mb"] = backlog.messages, round(backlog.bytes / 2**20, 1)
    return {"backlog-rss": row}


def _rss_summary(out: dict) -> None:
    runs = out["runs"]
    backlog = runs[0].get("backlog_messages") if runs else None
    mb = runs[0].get("backlog_mb") if runs else None
    k, b = out.get("kbroker"), out.get("baseline")
    if k is not None and b is not None:
        out["growth_mb"] = round(k - b, 1)
        out["summary"] = (
            f"{'bounded' if out['met'] else 'NOT bounded'}: receiving child "
            f"{k:,.0f} MB peak, +{k - b:,.0f} MB over connect-only, with a backlog of "
            f"{backlog:,} messages (~{mb:,.0f} MB of records)"
        )


scenario(
    Scenario(
        name="backlog-rss",
        description="peak RSS of a process receiving from a queue with a large backlog",
        rows=(
            Row(
                "backlog-rss",
                "MB",
                f"bounded: <= baseline + {RSS_BOUND_MB} MB",
                check=lambda r: r["kbroker"] - r["baseline"] <= RSS_BOUND_MB,
                floor=Floor(2 * RSS_BOUND_MB, "growth", at_most=True),
                baseline_code='kbroker/bench/scenarios/rss.py:CHILD (mode "baseline": connect only)',
                notes=f"child process: connect, RECEIVE {RSS_RECEIVE:,} messages (top=100) from a queue "
                "holding the backlog, peak RSS (VmHWM) vs a child that only imports kbroker and "
                "connects; ratio is kbroker/baseline (lower is better)",
                finish=_rss_summary,
            ),
        ),
        run=run_backlog_rss,
        setup=setup_backlog,
    )
)
