"""`kbroker bench --quick`, the regression guard: every scenario that fits, small, in one run of a
few minutes, failing when a row's figure crosses its floor (registry.Floor, set beside the row's
target). Pure: the quick sizes, the scenarios it leaves out, and the verdict on a results document.

One repetition, not three: at these sizes each repetition of the whole set takes about two
minutes on a 2-core machine, and the floors sit at about half of each target, wider than the
run-to-run spread seen on these machines (SEND 0.47-0.87 of the baseline between runs), so one
repetition tells a regression from noise as well as three would, in a third of the time."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields, replace
from typing import Any

from kbroker.bench.params import Params

# The quick sizes; an option given on the command line wins over them.
QUICK: dict[str, Any] = {
    "repeat": 1,
    "messages": 1_000,  # send, request-reply, transport (transport-io-bound: a quarter of it), transport-publish
    # io-bound: 500 messages (at 200 they were mostly the readers' start-up); SEND's first message
    # on each dialog claims its lease, so more would slow the send rows' small runs
    "conversations": 250,
    "backlog": 5_000,  # backlog-rss: still 5x what the child receives
    "samples": 5,  # activation-latency
    "drain_messages": 5_000,  # activation-drain
    "ramp_up": 1.0,  # activation-*: the worker's ramp-up; 5 s would be most of a small drain
    "ended_dialogs": 2_000,  # ended-dialogs
    "delayed_messages": 2_000,  # transport-delayed: 100 due a second over its 20 s
    "delayed_seconds": 20.0,  # transport-delayed: most of its time (one window, both sides at once)
    "outbox_messages": 500,  # transport-outbox: one at a time (max_concurrency 1), a few seconds a side
}
QUICK_FILE = "quick.json"  # where --quick writes its results, beside (never over) latest.json


def shrink(params: Params, given: Collection[str] = ()) -> Params:
    """`params` at the quick sizes, except the fields in `given` (set on the command line)."""
    known = {f.name for f in fields(Params)}
    unknown = set(QUICK) - known
    if unknown:  # a renamed parameter would silently stop being shrunk
        raise ValueError(f"quick sizes for unknown parameters: {sorted(unknown)}")
    return replace(params, **{k: v for k, v in QUICK.items() if k not in given})


def left_out(scenarios: dict, named: list[str]) -> dict[str, str]:
    """{scenario: why --quick leaves it out}, for the scenarios of the registry (name -> Scenario)
    that say they do not fit. Nothing when scenarios are named: those run, at the quick sizes."""
    if named:
        return {}
    return {n: s.not_quick for n, s in scenarios.items() if s.not_quick}


def verdict(results: list[dict], skipped_scenarios: dict[str, str]) -> dict:
    """The guard's verdict on a run's result rows: failed when a row crossed its floor or a
    scenario failed with an error. A row not measured (a side skipped: nothing to compare) or
    without a floor does not fail it."""
    below = [r["scenario"] for r in results if r.get("floor_held") is False]
    errors = sorted({r["scenario"] for r in results if r.get("error")})
    return {
        "passed": not below and not errors,
        "below_floor": below,
        "errors": errors,
        "checked": [r["scenario"] for r in results if r.get("floor_held") is not None],
        "left_out": skipped_scenarios,
    }


def describe(v: dict, results: list[dict]) -> list[str]:
    """The verdict in lines for a terminal."""
    by_name = {r["scenario"]: r for r in results}
    lines = []
    for name in v["below_floor"]:
        r = by_name[name]
        k = r.get("kbroker_detail") or {}
        cpu = "".join(
            f", CPU {k[key]} ms/{key.rsplit('_', 1)[1]}" for key in ("cpu_ms_per_msg", "cpu_ms_per_copy") if key in k
        )
        lines.append(
            f"{name}: BELOW FLOOR ({r.get('floor')}; ratio {r.get('ratio')}, kbroker "
            f"{r.get('kbroker')}, baseline {r.get('baseline')} {r.get('unit')}{cpu})"
        )
    for name in v["errors"]:
        lines.append(f"{name}: error: {by_name[name].get('error')}")
    for name, why in v["left_out"].items():
        lines.append(f"{name}: left out of --quick: {why}")
    lines.append(
        f"quick check {'passed' if v['passed'] else 'FAILED'}: {len(v['checked'])} rows against "
        f"their floors, {len(v['below_floor'])} below, {len(v['errors'])} with errors"
    )
    return lines
