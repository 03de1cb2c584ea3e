"""`kbroker bench scale`: how kbroker's cost grows, as curves rather than ratios.

    queues   N activated queues in one namespace, one worker (many_queues.py)
    dialogs  N open dialogs, one message each, sent then received (dialogs.py)
    workers  W workers sharing a namespace, draining an I/O-bound backlog (workers.py)

Each point is measured once (a curve's shape, not a ratio, is the finding); the results go to
OUT/scale.json, where a run of some curves keeps the others' last points, and the plot to
docs/scale.png (plot.py). docs/benchmarks.md, "Scaling", reads them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import orjson

from kbroker.bench.context import BenchContext
from kbroker.bench.harness import bench_broker, samples_dir
from kbroker.bench.machine import command_line, describe_machine
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.results import write_results
from kbroker.core.cluster import ClusterLike

CURVES = ("queues", "dialogs", "workers")
DEFAULTS = {"queues": (10, 100, 500), "dialogs": (10_000, 100_000, 1_000_000), "workers": (1, 2, 4, 8)}
RESULTS_FILE = "scale.json"
WORKER_BACKLOG = 10_000  # the worker curve's backlog, unless --drain-messages says otherwise


def _measure(curve: str, drain_messages: int) -> Callable[[BenchContext, int], dict[str, Any]]:
    from kbroker.bench.scale import (
        dialogs as scale_dialogs,
    )
    from kbroker.bench.scale import (
        many_queues as scale_queues,
    )
    from kbroker.bench.scale import (
        workers as scale_workers,
    )

    measures: dict[str, Callable[[BenchContext, int], dict[str, Any]]] = {
        "queues": scale_queues.measure,
        "dialogs": scale_dialogs.measure,
        "workers": lambda ctx, w: scale_workers.measure(ctx, w, messages=drain_messages),
    }
    return measures[curve]


def run_scale(
    points: dict[str, tuple[int, ...]],
    *,
    cluster: ClusterLike | None,
    reporter: Reporter,
    out_dir: Path,
    ramp_up: float = Params.ramp_up,
    drain_messages: int = WORKER_BACKLOG,
) -> dict[str, Any]:
    """Measure each curve's points in turn; returns the results document, written to
    OUT/scale.json with the previous run's curves that were not measured now. A point that
    fails is recorded with its error and the run goes on."""
    started = datetime.now(timezone.utc)
    previous = out_dir / RESULTS_FILE
    doc: dict[str, Any] = orjson.loads(previous.read_bytes()) if previous.is_file() else {}
    doc.setdefault("curves", {})
    with bench_broker(cluster, reporter) as (run_cluster, kafka_version, embedded):
        machine = describe_machine(kafka_version)
        ctx = BenchContext(
            run_cluster, Params(repeat=1, ramp_up=ramp_up), reporter, samples_dir(), kafka_version, embedded
        )
        for curve, ns in points.items():
            measured = []
            for n in ns:
                try:
                    measured.append(_measure(curve, drain_messages)(ctx, n))
                except Exception as exc:  # noqa: BLE001 - recorded, and the curve goes on
                    reporter.say(f"[red]{curve} {n:,}: {type(exc).__name__}: {exc}[/red]")
                    measured.append({"n": n, "error": f"{type(exc).__name__}: {exc}"})
                finally:
                    ctx.cleanup()
            doc["curves"][curve] = {
                "date": started.isoformat(timespec="seconds"),
                "command": command_line(),
                "machine": machine,
                "points": measured,
            }
    write_results(doc, out_dir, RESULTS_FILE)
    return doc


def parse_points(text: str) -> tuple[int, ...]:
    """ "10,100,500" -> (10, 100, 500); a ValueError names what is wrong."""
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"not a list of whole numbers: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"give one or more numbers of at least 1: {text!r}")
    return values
