"""The benchmark harness: scenario registry, repetitions and medians, the machine description,
and the results (bench-results/latest.json and the table in docs/benchmarks.md).

A scenario measures kbroker and its baseline in the same repetition, on the same broker; sides
alternate which goes first from one repetition to the next, so drift on a shared machine does not
always favour the same side. Each row reports the median of each side over the repetitions and
the ratio of those medians."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import psutil
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from kbroker.bench.params import Params
from kbroker.config import KAFKA_LOG

RESULTS_START = "<!-- results:start -->"
RESULTS_END = "<!-- results:end -->"
KBROKER_OVER_BASELINE = "kbroker/baseline"
BASELINE_OVER_KBROKER = "baseline/kbroker"


class Skip(Exception):
    """Raised by a scenario (or returned in a measurement) when kbroker cannot run it yet."""


@dataclass(frozen=True)
class Row:
    """One reported figure of a scenario: what is measured and what counts as good."""

    name: str
    unit: str
    target: str | None
    check: Callable[[dict], bool] | None = None  # the summarised row -> target met
    ratio: str = KBROKER_OVER_BASELINE
    notes: str = ""
    finish: Callable[[dict], None] | None = None  # adds derived fields (e.g. "summary") to the row


@dataclass(frozen=True)
class Scenario:
    """`run(ctx, state, rep)` measures one repetition and returns {row name: measurement}, a
    measurement being {"kbroker": value, "baseline": value, ...details} (a side that cannot run
    is None, with "skipped_reason"). `setup` runs once before the repetitions (its result is
    `state`), `teardown(ctx, state)` once after."""

    name: str
    description: str
    rows: tuple[Row, ...]
    run: Callable[["BenchContext", Any, int], dict[str, dict]]
    setup: Callable[["BenchContext"], Any] | None = None
    teardown: Callable[["BenchContext", Any], None] | None = None


SCENARIOS: dict[str, Scenario] = {}


def scenario(s: Scenario) -> Scenario:
    SCENARIOS[s.name] = s
    return s


def load_scenarios() -> dict[str, Scenario]:
    from kbroker.bench import activation, scenarios  # noqa: F401  (registers them: scenarios first, then activation)

    return SCENARIOS


def resolve_names(names: list[str] | tuple[str, ...]) -> list[str]:
    """Scenario names in registry order; a row name (send-pipelined) selects its scenario."""
    known = load_scenarios()
    if not names:
        return list(known)
    by_row = {r.name: s.name for s in known.values() for r in s.rows}
    wanted = set()
    for n in names:
        if n in known:
            wanted.add(n)
        elif n in by_row:
            wanted.add(by_row[n])
        else:
            raise ValueError(f"unknown scenario {n!r}; known: {', '.join(known)}")
    return [n for n in known if n in wanted]


# --- progress -------------------------------------------------------------------------------


class Reporter:
    """Progress on stderr: one line per phase, and a bar for long loops on a terminal."""

    def __init__(self, quiet: bool = False):
        self.console = Console(stderr=True)
        self.quiet = quiet
        self._t0 = time.monotonic()

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]{time.monotonic() - self._t0:7.1f}s[/dim] {msg}", highlight=False)

    @contextmanager
    def bar(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """Yields advance(n). Refreshed by the caller's advances only (no refresh thread, so a
        timed loop does not share the GIL with it); off a terminal, a line every 10%."""
        if self.quiet:
            yield lambda n: None
            return
        if not self.console.is_terminal:
            done, step = [0], max(1, total // 10)
            self.say(f"{description}: 0/{total}")

            def advance(n: int) -> None:
                before = done[0]
                done[0] += n
                if before < total and (done[0] // step > before // step or done[0] >= total):
                    self.say(f"{description}: {min(done[0], total)}/{total}")

            yield advance
            return
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, auto_refresh=False,
                            transient=True)
        with progress:
            task = progress.add_task(description, total=total)
            last = [0.0]

            def advance(n: int) -> None:
                progress.advance(task, n)
                now = time.monotonic()
                if now - last[0] > 0.2:
                    last[0] = now
                    progress.refresh()

            yield advance
        self.say(f"{description}: done")


# --- the run context --------------------------------------------------------------------------


@dataclass
class BenchContext:
    bootstrap: str
    params: Params
    reporter: Reporter
    samples: Path
    kafka_version: str
    embedded: bool = False
    namespaces: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        self.reporter.say(msg)

    def fresh_namespace(self, tag: str) -> str:
        """A new namespace with topics/samples applied (ExpenseQueue has 4 partitions)."""
        from kbroker.kafka.apply import apply_paths

        ns = f"bench-{tag}-{uuid.uuid4().hex[:8]}"[:40]
        apply_paths(self.bootstrap, ns, [self.samples])
        self.namespaces.append(ns)
        return ns

    def cleanup(self) -> None:
        """Delete the topics of the namespaces made by this run. Only on an external broker: an
        embedded one is thrown away with its data dir."""
        if self.embedded or not self.namespaces:
            return
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG})
        try:
            topics = admin.list_topics(timeout=30).topics
            prefixes = tuple(f"kbroker.{ns}." for ns in self.namespaces)
            mine = [t for t in topics if t.startswith(prefixes)]
            if mine:
                for f in admin.delete_topics(mine, operation_timeout=30).values():
                    try:
                        f.result()
                    except Exception:  # best effort: leftovers are named bench-*
                        pass
        except Exception as exc:
            self.say(f"[yellow]could not delete the benchmark's topics: {exc}[/yellow]")
        self.namespaces.clear()


def samples_dir() -> Path:
    here = Path(__file__).resolve().parents[2] / "topics" / "samples"
    return here if here.is_dir() else Path.cwd() / "topics" / "samples"


# --- medians and rows -----------------------------------------------------------------------


def _round(x: float | None) -> float | None:
    if x is None:
        return None
    return round(float(x), 2) if abs(x) >= 1 else float(f"{x:.4g}")


def summarise(row: Row, runs: list[dict]) -> dict:
    """The reported row: each side's median over the repetitions, their ratio, the target."""
    kb = [r["kbroker"] for r in runs if r.get("kbroker") is not None]
    bl = [r["baseline"] for r in runs if r.get("baseline") is not None]
    k = _round(statistics.median(kb)) if kb else None
    b = _round(statistics.median(bl)) if bl else None
    ratio = None
    if k is not None and b is not None:
        num, den = (k, b) if row.ratio == KBROKER_OVER_BASELINE else (b, k)
        ratio = float(f"{num / den:.5g}") if den else None
    out: dict[str, Any] = {
        "scenario": row.name, "unit": row.unit, "kbroker": k, "baseline": b, "ratio": ratio,
        "ratio_definition": row.ratio, "target": row.target, "met": None, "runs": runs,
        "notes": row.notes,
    }
    if len(kb) > 1 or len(bl) > 1:  # how noisy the repetitions were
        out["range"] = {side: [_round(min(v)), _round(max(v))] if v else None
                        for side, v in (("kbroker", kb), ("baseline", bl))}
    skipped = next((r["skipped_reason"] for r in runs if r.get("skipped_reason")), None)
    if skipped:
        out["skipped_reason"] = skipped
    # Details every repetition reports (latency percentiles, ...) get their median too.
    for side in ("kbroker", "baseline"):
        keys = {k2 for r in runs for k2 in (r.get(f"{side}_detail") or {})}
        detail = {}
        for key in sorted(keys):
            vals = [r[f"{side}_detail"][key] for r in runs
                    if isinstance((r.get(f"{side}_detail") or {}).get(key), (int, float))]
            if vals:
                detail[key] = _round(statistics.median(vals))
        if detail:
            out[f"{side}_detail"] = detail
    if k is not None and b is not None and row.check is not None:
        out["met"] = bool(row.check(out))
    if row.finish is not None and runs:
        row.finish(out)
    return out


def skipped_rows(s: Scenario, reason: str, key: str = "skipped_reason") -> list[dict]:
    return [{"scenario": r.name, "unit": r.unit, "kbroker": None, "baseline": None, "ratio": None,
             "ratio_definition": r.ratio, "target": r.target, "met": None, "runs": [],
             "notes": r.notes, key: reason} for r in s.rows]


def run_scenario(ctx: BenchContext, s: Scenario) -> list[dict]:
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
            except Exception as exc:  # never hide the scenario's own result or error
                ctx.say(f"[yellow]{s.name}: teardown failed: {exc}[/yellow]")
    return [summarise(r, runs[r.name]) for r in s.rows]


def _describe(m: dict, row: Row) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f}"

    text = f"kbroker {fmt(m.get('kbroker'))} vs baseline {fmt(m.get('baseline'))} {row.unit}"
    if m.get("skipped_reason"):
        text += f" (kbroker: {m['skipped_reason']})"
    return text


# --- machine ----------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _kbroker_version() -> str:
    try:
        version = importlib.metadata.version("kbroker")
    except importlib.metadata.PackageNotFoundError:
        from kbroker import __version__ as version
    # The commit, and whether the package differs from it. Read-only: --no-optional-locks keeps
    # `git status` from refreshing the index. Nothing is added outside a checkout.
    package = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=package, timeout=5)
        if rev.returncode == 0 and rev.stdout.strip():
            changed = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--", "."],
                                     capture_output=True, text=True, cwd=package, timeout=10)
            dirty = ", with uncommitted changes" if changed.returncode == 0 and changed.stdout.strip() else ""
            version += f" ({rev.stdout.strip()}{dirty})"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def describe_machine(kafka_version: str) -> dict:
    import confluent_kafka

    try:
        ck = importlib.metadata.version("confluent-kafka")
    except importlib.metadata.PackageNotFoundError:
        ck = "?"
    vm = psutil.virtual_memory()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(vm.total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kafka": kafka_version,
        "confluent_kafka": f"{ck} (librdkafka {confluent_kafka.libversion()[0]})",
        "kbroker": _kbroker_version(),
    }


# --- the broker for the run -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def bench_broker(bootstrap: str | None, reporter: Reporter) -> Iterator[tuple[str, str, bool]]:
    """(bootstrap, Kafka version, embedded?): the given broker, else an embedded one on free
    ports in a temporary data dir, stopped and removed when the run ends."""
    if bootstrap:
        yield bootstrap, "unknown (external broker)", False
        return
    from kbroker.embedded.broker import KAFKA_VERSION, EmbeddedBroker

    data_dir = Path(tempfile.mkdtemp(prefix="kbroker-bench-"))
    broker = EmbeddedBroker(data_dir, progress=lambda m: reporter.say(f"embedded broker: {m}"))
    try:
        status = broker.start(port=_free_port(), controller_port=_free_port())
        yield status.bootstrap, f"Apache Kafka {KAFKA_VERSION} (embedded, one KRaft node)", True
    finally:
        reporter.say("stopping the embedded broker")
        try:
            broker.stop()
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


# --- the run ------------------------------------------------------------------------------------


def run_bench(names: list[str], params: Params, *, bootstrap: str | None, reporter: Reporter,
              command: str = "kbroker bench") -> dict:
    """Run the named scenarios; returns the results document (what latest.json holds)."""
    selected = resolve_names(names)
    started = datetime.now(timezone.utc)
    with bench_broker(bootstrap, reporter) as (address, kafka_version, embedded):
        ctx = BenchContext(address, params, reporter, samples_dir(), kafka_version, embedded)
        machine = describe_machine(kafka_version)
        results: list[dict] = []
        try:
            for name in selected:
                s = SCENARIOS[name]
                try:
                    results.extend(run_scenario(ctx, s))
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    reporter.say(f"[red]{name} failed: {exc}[/red]")
                    if os.environ.get("KBROKER_BENCH_DEBUG"):
                        traceback.print_exc()
                    results.extend(skipped_rows(s, f"{type(exc).__name__}: {exc}", key="error"))
                finally:
                    ctx.cleanup()
        finally:
            ctx.cleanup()
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "command": command,
        "params": vars(params),
        "machine": machine,
        "results": results,
    }


def merge_previous(doc: dict, previous: Path) -> dict:
    """Rows of scenarios this run did not measure are carried over from the previous results file
    (marked `carried_from` with that run's date and command), in registry order, so running some
    scenarios does not drop the others' latest figures."""
    try:
        old = orjson.loads(previous.read_bytes())
    except (OSError, ValueError):
        return doc
    measured = {r["scenario"] for r in doc["results"]}
    by_name = {r["scenario"]: r for r in doc["results"]}
    for r in old.get("results") or []:
        if r.get("scenario") in measured or not isinstance(r, dict):
            continue
        by_name[r["scenario"]] = {**r, "carried_from": r.get("carried_from") or
                                  {"date": old.get("date"), "command": old.get("command")}}
    order = [row.name for s in load_scenarios().values() for row in s.rows]
    rank = {name: i for i, name in enumerate(order)}
    return {**doc, "results": sorted(by_name.values(), key=lambda r: rank.get(r["scenario"], len(order)))}


def write_results(doc: dict, out_dir: Path) -> Path:
    """bench-results/latest.json, written whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "latest.json"
    tmp = out_dir / "latest.json.tmp"
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)
    return path


# --- the docs table -----------------------------------------------------------------------------


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) < 10:
        return f"{v:,.2f}"
    return f"{v:,.0f}"


def results_markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        f"Run {doc['date']} (`{doc['command']}`, {doc['params']['repeat']} repetitions, medians), "
        f"{doc['duration_s']:.0f} s.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {m['os']}; load average "
        f"(1, 5, 15 min) {', '.join(str(x) for x in m['load_average'])} at the start, "
        f"{', '.join(str(x) for x in m.get('load_average_end') or ['?'])} at the end. "
        f"{m['python']}; {m['kafka']}; "
        f"confluent-kafka {m['confluent_kafka']}; kbroker {m['kbroker']}.",
        "",
        *(["Rows noted \"from the run of ...\" were not measured by this run: they are carried over "
            "from the previous results file (machine and parameters of that run).", ""]
          if any(r.get("carried_from") for r in doc["results"]) else []),
        "| scenario | unit | kbroker | baseline | ratio | target | met | notes |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in doc["results"]:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f} ({r['ratio_definition']})"
        met = {True: "yes", False: "**no**", None: "-"}[r.get("met")]
        notes = r.get("error") and f"error: {r['error']}" or r.get("skipped_reason") or ""
        extra = r.get("summary") or ""
        spread = ""
        if r.get("range") and r["range"].get("kbroker") and r["range"].get("baseline"):
            (k0, k1), (b0, b1) = r["range"]["kbroker"], r["range"]["baseline"]
            spread = f"runs: kbroker {_fmt(k0)}-{_fmt(k1)}, baseline {_fmt(b0)}-{_fmt(b1)}"
        carried = r.get("carried_from")
        carried = f"from the run of {carried.get('date')}" if carried else ""
        notes = "; ".join(x for x in (carried, notes, extra, spread) if x)
        lines.append(f"| {r['scenario']} | {r['unit']} | {_fmt(r.get('kbroker'))} | "
                     f"{_fmt(r.get('baseline'))} | {ratio} | {r.get('target') or '-'} | {met} | "
                     f"{notes.replace('|', '/')} |")
    return "\n".join(lines)


def update_docs(doc: dict, path: Path) -> None:
    """Rewrite what lies between the results markers of the Markdown file at `path`."""
    text = path.read_text()
    start, end = text.find(RESULTS_START), text.find(RESULTS_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no '{RESULTS_START}' ... '{RESULTS_END}' section")
    new = text[:start + len(RESULTS_START)] + "\n" + results_markdown(doc) + "\n" + text[end:]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def command_line() -> str:
    if not sys.argv:
        return "kbroker bench"
    prog = Path(sys.argv[0]).name
    args = ["python -m kbroker" if prog == "__main__.py" else prog, *sys.argv[1:]]
    return " ".join(args)
