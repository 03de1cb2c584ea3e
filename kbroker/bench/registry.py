"""The scenario registry: what a scenario is (its rows, how to run it), and the names `kbroker
bench` accepts. The scenario modules register themselves on import (`scenario(...)`), in the
order `load_scenarios` imports them, which is the order they run and are reported in."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from kbroker.bench.context import BenchContext

KBROKER_OVER_BASELINE = "kbroker/baseline"
BASELINE_OVER_KBROKER = "baseline/kbroker"
# The scenario modules, in the order their scenarios run and are reported.
SCENARIO_MODULES = (
    "send",
    "reply",
    "round_trip",
    "limits",
    "io",
    "rss",
    "endpoints",
    "activation_latency",
    "activation_drain",
    "analytics",
    "routing",
    "routing_secured",
    "transport",
    "transport_delayed",
    "transport_fanout",
    "transport_outbox",
)


@dataclass(frozen=True)
class Floor:
    """The worst figure `kbroker bench --quick` accepts for a row before it fails: set well on the
    wrong side of the row's target (about half of a ratio target), so that one noisy repetition
    of a small run passes and a regression does not. `of` is what it bounds: "ratio" (the row's
    ratio, as its ratio_definition states it), "kbroker" (kbroker's own median, for rows with an
    absolute target) or "growth" (kbroker - baseline, for the bounded-memory rows). `at_most`:
    lower is better (seconds, milliseconds, MB), so the figure must stay at or under `limit`.

    `cpu`: also the most CPU time, in ms a message, kbroker's side may spend (its detail's
    `cpu_key`, the process's CPU over the measured part). A ratio moves with the baseline's speed
    on a busy machine; kbroker's own CPU per message does much less, so it catches a regression
    the ratio's wide floor lets through. Set at about twice what quick runs measure."""

    limit: float
    of: str = "ratio"
    at_most: bool = False
    cpu: float | None = None
    cpu_key: str = "cpu_ms_per_msg"

    def figure(self, row: dict) -> float | None:
        """The figure of a summarised row this floor bounds; None when the row was not measured."""
        k, b = row.get("kbroker"), row.get("baseline")
        if self.of == "ratio":
            return row.get("ratio")
        if self.of == "kbroker":
            return k
        if self.of == "growth":
            return None if k is None or b is None else k - b
        raise ValueError(f"a floor bounds the ratio, kbroker or growth, not {self.of!r}")

    def holds(self, row: dict) -> bool | None:
        """Whether a summarised row is on the right side of the floor; None when not measured.
        A row measured without the CPU figure its floor bounds does not hold it: the figure
        going missing would otherwise turn the CPU floor off unseen."""
        v = self.figure(row)
        if v is None:
            return None
        held = v <= self.limit if self.at_most else v >= self.limit
        if self.cpu is None:
            return held
        cpu = self.cpu_figure(row)
        return held and cpu is not None and cpu <= self.cpu

    def cpu_figure(self, row: dict) -> float | None:
        """kbroker's CPU ms a message in a summarised row (its detail's median)."""
        v = (row.get("kbroker_detail") or {}).get(self.cpu_key)
        return float(v) if isinstance(v, (int, float)) else None

    def __str__(self) -> str:
        text = f"{self.of} {'<=' if self.at_most else '>='} {self.limit:,g}"
        return text if self.cpu is None else f"{text} and CPU <= {self.cpu:,g} ms/{self.cpu_key.rsplit('_', 1)[1]}"


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
    floor: Floor | None = None  # what `--quick` fails under; None for rows without a target
    # The code the baseline side runs ("path:function", several separated by "; "), for the
    # results and docs/benchmarks.md's table of baselines.
    baseline_code: str = ""


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
    # Why `kbroker bench --quick` leaves this scenario out ("" = it runs, at the quick sizes).
    not_quick: str = ""


SCENARIOS: dict[str, Scenario] = {}


def scenario(s: Scenario) -> Scenario:
    SCENARIOS[s.name] = s
    return s


def load_scenarios() -> dict[str, Scenario]:
    """Every scenario, registered by importing its module."""
    for module in SCENARIO_MODULES:
        importlib.import_module(f"kbroker.bench.scenarios.{module}")
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
