#!/usr/bin/env python
"""What one reply costs on each side of the request-reply benchmark: the side's rate, its
process's CPU per reply, the broker JVM's CPU per reply, and the records each side added to
Kafka's internal topics and to the namespace's own (docs/benchmarks.md, "Fifteenth round").

    .venv/bin/kbroker broker start --port 19300 --data-dir /tmp/profile-broker
    .venv/bin/python scripts/request_reply_costs.py --bootstrap 127.0.0.1:19300 \\
        --broker-pid "$(pgrep -f 'kafka.Kafka.*profile-broker')" --rounds 2

The broker must be one whose JVM runs on this machine (its CPU is read from /proc) and that
nothing else uses meanwhile. Each side runs measure_request_reply, the code the bench times.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from kbroker.bench.context import BenchContext
from kbroker.bench.harness import samples_dir
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.scenarios.reply import measure_request_reply
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.kafka.snapshot import reading_consumer, watermarks


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def end_offsets(cluster: ClusterLike) -> dict[str, int]:
    """Every topic's end offsets, summed over its partitions (the cluster's own settings, so a
    secured cluster answers too)."""
    consumer = reading_consumer(cluster, "kbroker-request-reply-costs")
    try:
        deadline = time.monotonic() + 30
        return {
            t: sum(watermarks(consumer, t, p, deadline)[1] for p in meta.partitions)
            for t, meta in consumer.list_topics(timeout=10).topics.items()
        }
    finally:
        consumer.close()


def side_costs(ctx: BenchContext, side: str, broker_pid: int) -> dict[str, Any]:
    n = ctx.params.messages
    before, cpu0 = end_offsets(ctx.cluster), cpu_seconds(broker_pid)
    out = measure_request_reply(ctx, side)
    cpu1, after = cpu_seconds(broker_pid), end_offsets(ctx.cluster)
    added = {t: after[t] - before.get(t, 0) for t in sorted(after) if after[t] != before.get(t, 0)}
    return {
        "side": side,
        "replies_per_s": round(out["value"]),
        "p50_ms": round(out["detail"]["p50_ms"]),
        "process_cpu_ms_per_reply": out["detail"]["cpu_ms_per_msg"],
        # The warm-up's 100 replies and the consumer group's join are in it too.
        "broker_cpu_ms_per_reply": round((cpu1 - cpu0) * 1000 / n, 3),
        "records_added": added,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--broker-pid", type=int, required=True, help="the broker JVM's process id")
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    ctx = BenchContext(
        Cluster(args.bootstrap),
        Params(repeat=1, messages=args.messages),
        Reporter(quiet=True),
        samples_dir(),
        "external",
    )
    try:
        for _ in range(args.rounds):
            for side in ("kbroker", "baseline"):
                print(json.dumps(side_costs(ctx, side, args.broker_pid)), flush=True)
    finally:
        ctx.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
