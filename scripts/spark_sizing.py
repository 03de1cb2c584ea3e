#!/usr/bin/env python
"""Sizing the analytics job on a Spark standalone cluster: its batch time against the rows per batch,
per layout (executors x cores) and message rate. The figures of docs/analytics.md ("Sizing").

    PYTHONPATH=. .venv/bin/python scripts/spark_sizing.py [--layouts local[2],1x1,2x1] [--rates 200,2000]
                                                          [--seconds 30] [--backlog 60000] [--json]

It starts its own embedded broker (free ports, a temporary data dir) and, per layout, a Spark
standalone cluster on this machine (tests/helpers/spark_cluster.py: `WxC` is W workers of C cores,
one executor each; `local[N]` no cluster) and `kbroker analytics run --master ...` on a fresh
namespace whose queue has `--partitions` partitions. Per layout: the job's first batch (warm-up) is
left out, and a warm-up of 5,000 SENDs; then SENDs at each rate for `--seconds` (in a transaction every
quarter second), then a backlog of `--backlog` SENDs the job drains in batches of at most 20,000.
Each rate reports the median batch seconds and rows per batch (from the job's log) and how long after
the last SEND the job had read them all (`behind_s`); the drain its rows per busy second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's kbroker and tests.helpers

CATALOG = """
message_types: [{name: //kbroker/sizing/Work, validation: NONE}]
contracts: [{name: //kbroker/sizing/Contract, messages: [{type: //kbroker/sizing/Work, sent_by: ANY}]}]
queues: [{name: SizingQueue, partitions: %d}, {name: ClientQueue, partitions: 1}]
services:
  - {name: //kbroker/sizing/Client, queue: ClientQueue}
  - {name: //kbroker/sizing/Target, queue: SizingQueue, contracts: [//kbroker/sizing/Contract]}
"""


def batches(log: Path) -> list[dict[str, float]]:
    """The job's batches as it logged them (`analytics batch=N rows=N ... seconds=S`)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if "analytics batch=" in line:
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            out.append({"rows": int(fields["rows"]), "seconds": float(fields["seconds"])})
    return out


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    busy = [b for b in rows if b["rows"]]
    if not busy:
        return {"batches": 0}
    return {
        "batches": len(busy),
        "median_rows": statistics.median(b["rows"] for b in busy),
        "median_seconds": round(statistics.median(b["seconds"] for b in busy), 2),
        "max_seconds": max(b["seconds"] for b in busy),
    }


def sender(bootstrap: str, ns: str) -> tuple[Any, list[str]]:
    from kbroker.sdk.broker import Broker

    b = Broker(bootstrap, ns)
    return b, [
        b.begin_dialog("//kbroker/sizing/Client", "//kbroker/sizing/Target", "//kbroker/sizing/Contract")
        for _ in range(64)
    ]


def send_at(b: Any, handles: list[str], rate: int, seconds: float) -> int:
    """`rate` SENDs a second for `seconds`, a transaction per quarter second; how many were sent."""
    sent, start = 0, time.monotonic()
    while (now := time.monotonic() - start) < seconds:
        due = int(rate * min(seconds, now + 0.25))
        with b.transaction() as tx:
            for i in range(sent, due):
                tx.send(handles[i % len(handles)], "//kbroker/sizing/Work", b"x" * 100)
        sent = due
        time.sleep(max(0.0, 0.25 - (time.monotonic() - start - now)))
    return sent


def run_layout(layout: str, bootstrap: str, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    from kbroker.kafka.catalog.apply import apply_paths
    from tests.helpers import wait_for
    from tests.helpers.spark_cluster import SparkCluster, job_conf
    from tests.integration.test_analytics import JobProcess

    ns = "z" + uuid.uuid4().hex[:10]
    catalog = home / f"{ns}.yaml"
    catalog.write_text(CATALOG % args.partitions)
    apply_paths(bootstrap, ns, [catalog])
    cluster = None
    if not layout.startswith("local"):
        workers, cores = (int(n) for n in layout.split("x"))
        cluster = SparkCluster(home / f"spark-{layout}", workers=workers, cores=cores, memory="1g").start()
    master = cluster.url if cluster else layout
    job = JobProcess(
        bootstrap, ns, home / layout, 1, master=master, args=[*job_conf(), "--conf", "spark.driver.memory=1g"]
    )
    b, handles = sender(bootstrap, ns)
    result: dict[str, Any] = {"layout": layout, "partitions": args.partitions}
    read = lambda: sum(int(x["rows"]) for x in batches(job.log))  # noqa: E731
    try:
        wait_for(lambda: batches(job.log), 300, f"the first batch ({job.log})")
        # Warm-up, left out: the first batches with rows (code generation, the executors' consumers).
        send_at(b, handles, 500, 10)
        wait_for(lambda: read() >= 5000, 300, "the warm-up read")
        for rate in args.rates:
            before, total = len(batches(job.log)), read()
            sent = send_at(b, handles, rate, args.seconds)
            sent_at = time.monotonic()
            wait_for(lambda: read() >= total + sent, 300, f"the {rate}/s phase read", interval=0.1)  # noqa: B023 - called now
            result[f"rate_{rate}"] = {
                "sent": sent,
                "behind_s": round(time.monotonic() - sent_at, 1),
                **summary(batches(job.log)[before:]),
            }
            print(layout, rate, result[f"rate_{rate}"], flush=True)
        before, total = len(batches(job.log)), read()
        for start in range(0, args.backlog, 5000):  # written before the job's next batch, mostly
            with b.transaction() as tx:
                for i in range(start, min(args.backlog, start + 5000)):
                    tx.send(handles[i % len(handles)], "//kbroker/sizing/Work", b"x" * 100)
        wait_for(lambda: read() >= total + args.backlog, 600, "the backlog drained")
        drain = [x for x in batches(job.log)[before:] if x["rows"]]
        busy = sum(x["seconds"] for x in drain)
        result["drain"] = {
            "rows": sum(int(x["rows"]) for x in drain),
            "batches": len(drain),
            "busy_rows_per_s": round(sum(x["rows"] for x in drain) / busy) if busy else None,
            "median_seconds": round(statistics.median(x["seconds"] for x in drain), 2),
        }
        print(layout, "drain", result["drain"], flush=True)
    finally:
        b.close()
        job.stop()
        if cluster is not None:
            cluster.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="local[2],1x1,2x1")
    parser.add_argument("--rates", default="200,2000", type=lambda s: [int(r) for r in s.split(",")])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--backlog", type=int, default=60000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tests.helpers import embedded_kafka

    with tempfile.TemporaryDirectory(prefix="kbroker-spark-sizing-") as tmp:
        home = Path(tmp)
        with embedded_kafka(home / "kafka") as bootstrap:
            results = []
            for layout in args.layouts.split(","):
                (home / layout).mkdir()
                results.append(run_layout(layout, bootstrap, home, args))
    print(json.dumps(results, indent=2) if args.json else "\n".join(map(str, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
