"""`kbroker bench [SCENARIO...]`: the benchmark harness (kbroker/bench), side by side with a
plain-Kafka baseline in the same run, reported as ratios of medians."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click
import orjson

from kbroker.bench.params import Params
from kbroker.cli.bench_scenarios import SCENARIO_NAMES, require_worker, require_worker_for_activation
from kbroker.cli.common import cluster_option, emit_json, fail, handle_errors, json_option, main
from kbroker.cli.output import make_console, new_table, print_table


@main.command("bench")
@click.argument("scenarios", nargs=-1, type=click.Choice(SCENARIO_NAMES))
@click.option(
    "--repeat",
    default=Params.repeat,
    show_default=True,
    type=click.IntRange(min=1),
    help="Repetitions per scenario; medians are reported, with the run-to-run range.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="The regression guard: every scenario that fits, small and once (options given "
    "still apply), exiting 1 when a row crosses its floor; results go to OUT/quick.json "
    "only (never latest.json or the docs).",
)
@click.option(
    "--messages",
    default=Params.messages,
    show_default=True,
    type=click.IntRange(min=1),
    help="Messages per repetition of send, request-reply and transport (transport-publish: events).",
)
@click.option(
    "--conversations",
    default=Params.conversations,
    show_default=True,
    type=click.IntRange(min=1),
    help="Dialogs the messages are spread over (io-bound: 2 messages each).",
)
@click.option(
    "--backlog",
    default=Params.backlog,
    show_default=True,
    type=click.IntRange(min=1),
    help="Messages queued before backlog-rss receives.",
)
@click.option(
    "--readers",
    default=Params.readers,
    show_default=True,
    type=click.IntRange(min=1),
    help="request-reply: kbroker responder threads.",
)
@click.option(
    "--in-flight",
    default=Params.in_flight,
    show_default=True,
    type=click.IntRange(min=1),
    help="request-reply: requests in flight per dialog.",
)
@click.option(
    "--samples",
    default=Params.samples,
    show_default=True,
    type=click.IntRange(min=1),
    help="activation-latency: first-message latencies per repetition.",
)
@click.option(
    "--drain-messages",
    default=Params.drain_messages,
    show_default=True,
    type=click.IntRange(min=1),
    help="activation-drain: the backlog each side drains per repetition (scale: the worker "
    "curve's, 10,000 unless given).",
)
@click.option(
    "--max-readers",
    default=Params.max_readers,
    show_default=True,
    type=click.IntRange(min=1),
    help="activation-drain: max_queue_readers, and the size of the fixed pool.",
)
@click.option(
    "--ramp-up",
    default=Params.ramp_up,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="activation-*: the worker's --ramp-up seconds.",
)
@click.option(
    "--ended-dialogs",
    default=Params.ended_dialogs,
    show_default=True,
    type=click.IntRange(min=1),
    help="ended-dialogs: dialogs whose ended endpoints the namespace holds.",
)
@click.option(
    "--delayed-messages",
    default=Params.delayed_messages,
    show_default=True,
    type=click.IntRange(min=1),
    help="transport-delayed: delayed messages per side and repetition.",
)
@click.option(
    "--delayed-seconds",
    default=Params.delayed_seconds,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="transport-delayed: the window (s) their due times are spread over; a repetition takes about this long.",
)
@click.option(
    "--outbox-messages",
    default=Params.outbox_messages,
    show_default=True,
    type=click.IntRange(min=1),
    help="transport-outbox: messages each side handles per repetition, one at a time.",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of latest.json (quick.json with --quick).",
)
@click.option(
    "--docs",
    "docs_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Markdown file whose results section is rewritten (default: docs/benchmarks.md when it exists).",
)
@click.option("--no-docs", is_flag=True, help="Do not rewrite any results table.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@click.option(
    "--secure",
    is_flag=True,
    help="Run the scenarios again on a secured embedded broker (SASL_SSL, SCRAM-SHA-512) and "
    "report each as a ratio to plaintext: the cost of TLS and SCRAM.",
)
@click.option(
    "--queues",
    "scale_queues",
    default=None,
    metavar="N,N,...",
    help="scale: the queue curve's points (default 10,100,500).",
)
@click.option(
    "--dialogs",
    "scale_dialogs",
    default=None,
    metavar="N,N,...",
    help="scale: the open-dialog curve's points (default 10000,100000,1000000).",
)
@click.option(
    "--workers",
    "scale_workers",
    default=None,
    metavar="N,N,...",
    help="scale: the worker curve's points (default 1,2,4).",
)
@cluster_option
@json_option
@handle_errors
def bench(
    scenarios,
    quick,
    out_dir,
    docs_path,
    no_docs,
    quiet,
    secure,
    scale_queues,
    scale_dialogs,
    scale_workers,
    target,
    as_json,
    **sizes,  # the options named after Params' fields (--repeat, --messages, ...)
):
    """Benchmark kbroker against a plain confluent-kafka baseline on the same broker.

    SCENARIOS: send (with send-pipelined), request-reply, round-trip, limits, io-bound, backlog-rss, ended-dialogs,
    activation-latency, activation-drain, analytics, routing, transport, transport-delayed,
    transport-publish, transport-outbox; all by default. Uses --bootstrap / KBROKER_BOOTSTRAP
    when given, else starts an embedded broker on free ports in a temporary data dir for the run.
    Progress goes to stderr; results to OUT/latest.json and the results table of the docs; --json
    prints them on stdout. --quick: see docs/benchmarks.md, "Before merging: the quick check".

    `kbroker bench scale` measures how cost grows instead (queues, open dialogs, workers; only
    the curves given with --queues/--dialogs/--workers, or all three at their defaults): results
    to OUT/scale.json, the plot to docs/scale.png; see docs/benchmarks.md, "Scaling"."""
    if "scale" in scenarios:
        source = click.get_current_context().get_parameter_source("drain_messages")
        drain = sizes["drain_messages"] if source == click.core.ParameterSource.COMMANDLINE else None
        _scale(
            scenarios,
            quick,
            secure,
            scale_queues,
            scale_dialogs,
            scale_workers,
            sizes["ramp_up"],
            drain,
            out_dir,
            no_docs,
            quiet,
            target,
            as_json,
        )
        return
    names = list(scenarios)
    if quick:
        from kbroker.bench.quick import left_out, shrink
        from kbroker.bench.registry import load_scenarios

        registered = load_scenarios()
        skipped = left_out(registered, names)
        names = names or [n for n in registered if n not in skipped]
        scenarios = tuple(names)
    require_worker_for_activation(scenarios)
    from kbroker.bench.harness import (
        Reporter,
        command_line,
        merge_previous,
        run_bench,
        update_docs,
        write_results,
    )

    # A terminated run still stops its embedded broker and child processes (finally blocks).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    params = Params(**sizes)
    reporter = Reporter(quiet=quiet)
    if quick:
        source = click.get_current_context().get_parameter_source
        given = {f for f in vars(params) if source(f) == click.core.ParameterSource.COMMANDLINE}
        _quick(names, shrink(params, given), skipped, target, reporter, out_dir, secure, as_json)
        return
    if docs_path is None and not no_docs and Path("docs/benchmarks.md").is_file():
        docs_path = Path("docs/benchmarks.md")
    doc = run_bench(names, params, cluster=target.explicit, reporter=reporter, command=command_line(), secure=secure)
    doc = merge_previous(doc, out_dir / "latest.json")
    path = write_results(doc, out_dir)
    reporter.say(f"results written to {path}")
    if docs_path is not None and not no_docs:
        update_docs(doc, docs_path)
        reporter.say(f"results table updated in {docs_path}")
    if as_json:
        emit_json(doc)
    else:
        _print_table(doc)
    if any(r.get("error") for r in doc["results"]):
        raise SystemExit(1)


def _quick(names, params, skipped, target, reporter, out_dir, secure, as_json) -> None:
    """Run the guard: no docs, no latest.json, no rows carried over; OUT/quick.json; exit 1 on
    a row below its floor or a scenario's error."""
    from kbroker.bench.harness import command_line, run_bench, write_results
    from kbroker.bench.quick import QUICK_FILE, describe, verdict

    for name, why in skipped.items():
        reporter.say(f"{name}: left out of --quick ({why})")
    doc = run_bench(names, params, cluster=target.explicit, reporter=reporter, command=command_line(), secure=secure)
    doc["quick"] = verdict(doc["results"], skipped)
    reporter.say(f"results written to {write_results(doc, out_dir, QUICK_FILE)}")
    if as_json:
        emit_json(doc)
    else:
        _print_table(doc)
        console = make_console()
        for line in describe(doc["quick"], doc["results"]):
            console.print(line, highlight=False)
    if not doc["quick"]["passed"]:
        raise SystemExit(1)


def _scale(
    scenarios,
    quick,
    secure,
    queues,
    dialogs,
    workers,
    ramp_up,
    drain_messages,
    out_dir,
    no_docs,
    quiet,
    target,
    as_json,
) -> None:
    from kbroker.bench.scale.run import DEFAULTS, WORKER_BACKLOG, parse_points, run_scale

    if len(scenarios) > 1 or quick or secure:
        fail("scale runs alone: name no other scenario, and no --quick or --secure")
    given = {"queues": queues, "dialogs": dialogs, "workers": workers}
    try:
        points = {c: parse_points(v) for c, v in given.items() if v is not None} or dict(DEFAULTS)
    except ValueError as exc:
        fail(f"scale: {exc}")
    if {"queues", "workers"} & set(points):
        require_worker("or name only --dialogs")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    from kbroker.bench.harness import Reporter

    reporter = Reporter(quiet=quiet)
    doc = run_scale(
        points,
        cluster=target.explicit,
        reporter=reporter,
        out_dir=out_dir,
        ramp_up=ramp_up,
        drain_messages=drain_messages or WORKER_BACKLOG,
    )
    reporter.say(f"results written to {out_dir / 'scale.json'}")
    if not no_docs and Path("docs").is_dir():
        from kbroker.bench.scale.plot import plot

        reporter.say(f"plot written to {plot(doc, Path('docs/scale.png'))}")
    if as_json:
        emit_json(doc)
        return
    console = make_console()
    for curve, data in doc["curves"].items():
        for point in data["points"]:
            console.print(f"{curve}: {orjson.dumps(point).decode()}", highlight=False)


def _print_table(doc: dict) -> None:
    def fmt(v) -> str:
        return "-" if v is None else (f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}")

    columns = ("scenario", "unit", "kbroker", "baseline", "ratio", "ratio runs", "target", "met", "floor")
    table = new_table(f"kbroker bench, {doc['date']} (medians of {doc['params']['repeat']})", *columns)
    for column in table.columns:
        if column.header in ("kbroker", "baseline", "ratio"):
            column.justify = "right"
    notes = []
    for r in doc["results"]:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        if r.get("ratio") is not None and r["ratio_definition"] != "kbroker/baseline":
            ratio += f" ({r['ratio_definition']})"
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}[r.get("met")]
        held = {True: "held", False: "[red]BELOW[/red]", None: ""}[r.get("floor_held")]
        spread = "-" if not r.get("ratio_range") else "{:.2f}-{:.2f}".format(*r["ratio_range"])
        table.add_row(
            r["scenario"],
            r["unit"],
            fmt(r.get("kbroker")),
            fmt(r.get("baseline")),
            ratio,
            spread,
            r.get("target") or "-",
            met,
            f"{r.get('floor') or '-'} {held}".strip(),
        )
        if r.get("error"):
            notes.append(f"{r['scenario']}: [red]error: {r['error']}[/red]")
        elif r.get("skipped_reason"):
            notes.append(f"{r['scenario']}: {r['skipped_reason']}")
        if r.get("summary"):
            notes.append(f"{r['scenario']}: {r['summary']}")
    console = make_console()
    print_table(table, console)
    console.print("ratio = kbroker/baseline unless stated", style="dim")
    for line in notes:
        console.print(line, highlight=False)
