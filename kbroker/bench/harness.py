"""The benchmark harness: runs the scenarios' repetitions on one broker and returns the results
document. A scenario measures kbroker and its baseline in the same repetition, on the same broker;
sides alternate which goes first from one repetition to the next, so drift on a shared machine
does not always favour the same side. Each row reports the median of each side over the
repetitions and the ratio of those medians.

    context.py   what a scenario runs with (BenchContext)
    registry.py  what a scenario is, the registry, and scenario names
    progress.py  progress on stderr
    results.py   medians and ratios, the results file and the docs table
    machine.py   the machine description and command line"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from kbroker.bench.context import BenchContext
from kbroker.bench.machine import command_line, describe_machine
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.registry import (
    BASELINE_OVER_KBROKER,
    KBROKER_OVER_BASELINE,
    SCENARIOS,
    Floor,
    Row,
    Scenario,
    Skip,
    load_scenarios,
    resolve_names,
    scenario,
)
from kbroker.bench.results import (
    RESULTS_END,
    RESULTS_START,
    merge_previous,
    results_markdown,
    skipped_rows,
    summarise,
    update_docs,
    write_results,
)
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.errors import InvalidArgumentError

# What the CLI, the tests and the scenario modules use from here.
__all__ = [
    "BASELINE_OVER_KBROKER",
    "KBROKER_OVER_BASELINE",
    "RESULTS_END",
    "RESULTS_START",
    "SCENARIOS",
    "BenchContext",
    "Floor",
    "Reporter",
    "Row",
    "Scenario",
    "Skip",
    "bench_broker",
    "command_line",
    "describe_machine",
    "free_port",
    "load_scenarios",
    "merge_previous",
    "resolve_names",
    "results_markdown",
    "run_bench",
    "run_scenario",
    "samples_dir",
    "scenario",
    "summarise",
    "update_docs",
    "write_results",
]


def samples_dir() -> Path:
    """The expenses sample shipped with kbroker (topics/samples of a checkout): what namespaces apply."""
    from kbroker.core.catalog.loader import SAMPLES

    return SAMPLES


def run_scenario(ctx: BenchContext, s: Scenario) -> list[dict]:
    """Set up, run the repetitions, tear down; returns the scenario's summarised rows."""
    ctx.say(f"[bold]{s.name}[/bold]: {s.description}")
    try:
        state = s.setup(ctx) if s.setup else None
    except Skip as exc:
        ctx.say(f"{s.name}: skipped ({exc})")
        return skipped_rows(s, str(exc))
    runs: dict[str, list[dict]] = {r.name: [] for r in s.rows}
    try:
        for rep in range(ctx.params.repeat):
            ctx.say(f"{s.name}: repetition {rep + 1}/{ctx.params.repeat}")
            gc.collect()
            measured = s.run(ctx, state, rep)
            for name, m in measured.items():
                runs[name].append({"rep": rep + 1, **m})
                ctx.say(f"{name}: " + _describe(m, next(r for r in s.rows if r.name == name)))
    except Skip as exc:
        ctx.say(f"{s.name}: skipped ({exc})")
        return skipped_rows(s, str(exc))
    finally:
        if s.teardown:
            try:
                s.teardown(ctx, state)
            except Exception as exc:  # noqa: BLE001 - never hide the scenario's own result or error
                ctx.say(f"[yellow]{s.name}: teardown failed: {exc}[/yellow]")
    return [summarise(r, runs[r.name]) for r in s.rows]


def _describe(m: dict, row: Row) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f}"

    text = f"kbroker {fmt(m.get('kbroker'))} vs baseline {fmt(m.get('baseline'))} {row.unit}"
    if m.get("skipped_reason"):
        text += f" (kbroker: {m['skipped_reason']})"
    return text


def _run_scenarios(selected: list[str], ctx: BenchContext, reporter: Reporter) -> list[dict]:
    results: list[dict] = []
    try:
        for name in selected:
            s = SCENARIOS[name]
            try:
                results.extend(run_scenario(ctx, s))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed scenario is a row of its own; the rest run
                reporter.say(f"[red]{name} failed: {exc}[/red]")
                if os.environ.get("KBROKER_BENCH_DEBUG"):
                    traceback.print_exc()
                results.extend(skipped_rows(s, f"{type(exc).__name__}: {exc}", key="error"))
            finally:
                ctx.cleanup()
    finally:
        ctx.cleanup()
    return results


def secured_rows(plain: list[dict], secured: list[dict]) -> list[dict]:
    """Per row of both runs: kbroker's figure on the secured broker against its figure on the
    plaintext one, as `<scenario> (TLS+SCRAM)`. Rows where less is better (times, MB) give
    plaintext/secured, so a ratio under 1 is a cost either way."""
    by_name = {r["scenario"]: r for r in plain}
    rows = []
    for s in secured:
        p = by_name.get(s["scenario"])
        if p is None or s.get("kbroker") is None or p.get("kbroker") is None:
            continue
        lower_better = str(s.get("unit", "")).split(" ")[0] in ("ms", "s", "MB")
        ratio = (p["kbroker"] / s["kbroker"]) if lower_better else (s["kbroker"] / p["kbroker"])
        rows.append(
            {
                "scenario": f"{s['scenario']} (TLS+SCRAM)",
                "unit": s["unit"],
                "kbroker": s["kbroker"],
                "baseline": p["kbroker"],
                "ratio": round(ratio, 3),
                "ratio_definition": "plaintext/secured" if lower_better else "secured/plaintext",
                "target": None,
                "met": None,
                "floor": None,
                "floor_held": None,
                "range": {
                    "kbroker": (s.get("range") or {}).get("kbroker"),
                    "baseline": (p.get("range") or {}).get("kbroker"),
                },
                "summary": f"secured {s['kbroker']:,.1f} vs plaintext {p['kbroker']:,.1f} {s['unit']}; "
                f"the secured run's own baseline: {s.get('baseline')}",
            }
        )
    return rows


# --- the broker for the run -------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on this host now (embedded.ports.free_port: not one a client may take)."""
    from kbroker.embedded.ports import free_port as free

    return free()


@contextmanager
def bench_broker(
    cluster: ClusterLike | None, reporter: Reporter, label: str = "embedded broker", secure: bool = False
) -> Iterator[tuple[Cluster, str, bool]]:
    """(cluster, Kafka version, embedded?): the given cluster, else an embedded broker on free
    ports in a temporary data dir, stopped and removed when the context ends. `label` names it
    in progress (the routing scenario's second cluster is one too). `secure`: the embedded broker
    runs secured (TLS, SASL) and the run logs in as its admin with SCRAM-SHA-512."""
    if cluster:
        yield Cluster.of(cluster), "unknown (external broker)", False
        return
    from kbroker.embedded.broker import KAFKA_VERSION, EmbeddedBroker
    from kbroker.embedded.secure import read_properties

    data_dir = Path(tempfile.mkdtemp(prefix="kbroker-bench-"))
    broker = EmbeddedBroker(data_dir, progress=lambda m: reporter.say(f"{label}: {m}"))
    try:
        status = broker.start(
            port=free_port(), controller_port=free_port(), secure=secure, tls_port=free_port() if secure else None
        )
        assert status.bootstrap is not None  # a started broker has an address
        # A secured broker as its admin, from the client properties file it wrote.
        admin = read_properties(status.client_properties) if status.client_properties else {}
        yield (
            Cluster.with_properties(status.bootstrap, admin),
            f"Apache Kafka {KAFKA_VERSION} (embedded, one KRaft node"
            f"{', SASL_SSL with SCRAM-SHA-512' if secure else ''})",
            True,
        )
    finally:
        reporter.say(f"stopping the {label}")
        try:
            broker.stop()
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


# --- the run ------------------------------------------------------------------------------------


def run_bench(
    names: list[str],
    params: Params,
    *,
    cluster: ClusterLike | None,
    reporter: Reporter,
    command: str = "kbroker bench",
    secure: bool = False,
) -> dict:
    """Run the named scenarios; returns the results document (what latest.json holds).
    `secure`: run them again on a secured embedded broker and add, per row, the secured run's
    figure as a ratio to the plaintext one (the cost of TLS and SCRAM)."""
    selected = resolve_names(names)
    started = datetime.now(timezone.utc)
    if secure and cluster:
        raise InvalidArgumentError(
            "--secure compares two embedded brokers it starts, plain and secured: give no --bootstrap"
        )
    with bench_broker(cluster, reporter) as (run_cluster, kafka_version, embedded):
        machine = describe_machine(kafka_version)
        results = _run_scenarios(
            selected, BenchContext(run_cluster, params, reporter, samples_dir(), kafka_version, embedded), reporter
        )
    if secure:
        with bench_broker(None, reporter, "secured embedded broker", secure=True) as (run_cluster, version, _):
            secured = _run_scenarios(
                selected, BenchContext(run_cluster, params, reporter, samples_dir(), version, True), reporter
            )
        results += secured_rows(results, secured)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "command": command,
        "params": vars(params),
        "machine": machine,
        "results": results,
    }
