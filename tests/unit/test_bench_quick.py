"""`kbroker bench --quick`, the regression guard: floors, the verdict, the quick sizes, and the
definitions every row must carry (a floor beside each target, the baseline's code path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbroker.bench.harness import Floor, Row, load_scenarios, merge_previous, summarise, write_results
from kbroker.bench.params import Params
from kbroker.bench.quick import QUICK, left_out, shrink, verdict
from kbroker.bench.results import results_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_a_floor_bounds_the_ratio_kbroker_or_the_growth_in_its_direction():
    row = {"kbroker": 300.0, "baseline": 100.0, "ratio": 3.0}
    assert Floor(2.0).holds(row) is True and Floor(3.5).holds(row) is False
    assert Floor(3.0).holds(row) is True  # at the floor is still on it
    assert Floor(2.5, at_most=True).holds(row) is False  # lower is better: 3.0 > 2.5
    assert Floor(400, "kbroker", at_most=True).holds(row) is True
    assert Floor(250, "kbroker", at_most=True).holds(row) is False
    assert Floor(150, "growth", at_most=True).holds(row) is False  # 300 - 100 = 200
    assert Floor(200, "growth", at_most=True).holds(row) is True
    assert Floor(0.4).holds({"kbroker": None, "baseline": 5.0, "ratio": None}) is None
    assert Floor(512, "growth", at_most=True).holds({"kbroker": 5.0, "baseline": None}) is None
    assert (str(Floor(0.4)), str(Floor(3000, "kbroker", at_most=True))) == ("ratio >= 0.4", "kbroker <= 3,000")
    with pytest.raises(ValueError, match="not 'p99'"):
        Floor(1, "p99").holds(row)


def test_a_cpu_floor_bounds_kbrokers_own_cpu_per_message_beside_the_ratio():
    floor = Floor(0.4, cpu=0.8)
    fast = {"ratio": 0.9, "kbroker_detail": {"cpu_ms_per_msg": 0.5}}
    assert floor.holds(fast) is True
    assert floor.holds({**fast, "kbroker_detail": {"cpu_ms_per_msg": 0.8}}) is True  # at the floor
    # The baseline's luck lifts the ratio; kbroker's own CPU still says it regressed.
    assert floor.holds({"ratio": 2.0, "kbroker_detail": {"cpu_ms_per_msg": 1.2}}) is False
    assert floor.holds({"ratio": 0.3, "kbroker_detail": {"cpu_ms_per_msg": 0.1}}) is False
    # Measured but without its CPU figure: not held, so a renamed detail cannot switch it off.
    assert floor.holds({"ratio": 0.9, "kbroker_detail": {}}) is False
    assert floor.holds({"ratio": None}) is None  # not measured
    per_copy = Floor(0.25, cpu=0.05, cpu_key="cpu_ms_per_copy")
    assert per_copy.holds({"ratio": 0.7, "kbroker_detail": {"cpu_ms_per_copy": 0.02}}) is True
    assert (str(floor), str(per_copy)) == (
        "ratio >= 0.4 and CPU <= 0.8 ms/msg",
        "ratio >= 0.25 and CPU <= 0.05 ms/copy",
    )


def test_a_summarised_row_says_whether_it_held_its_floor_and_gives_every_range():
    row = Row(
        "x",
        "msg/s",
        "ratio >= 0.8",
        check=lambda r: r["ratio"] >= 0.8,
        floor=Floor(0.4),
        baseline_code="kbroker/bench/x.py:f",
    )
    runs = [
        {"kbroker": 10.0, "baseline": 40.0},
        {"kbroker": 30.0, "baseline": 20.0},
        {"kbroker": 20.0, "baseline": 30.0},
    ]
    out = summarise(row, runs)
    assert (out["ratio"], out["met"], out["floor_held"], out["floor"]) == (0.66667, False, True, "ratio >= 0.4")
    assert out["range"] == {"kbroker": [10.0, 30.0], "baseline": [20.0, 40.0]}
    assert out["ratio_range"] == [0.25, 1.5]  # per repetition: 10/40, 30/20, 20/30
    assert out["baseline_code"] == "kbroker/bench/x.py:f"
    # One repetition still gives its range; a side that did not run gives none.
    one = summarise(row, [{"kbroker": None, "baseline": 5.0, "skipped_reason": "not yet"}])
    assert one["range"] == {"kbroker": None, "baseline": [5.0, 5.0]} and one["ratio_range"] is None
    assert one["floor_held"] is None
    below = summarise(row, [{"kbroker": 1.234567, "baseline": 4.000001}])
    assert below["floor_held"] is False and below["range"]["kbroker"] == [1.23, 1.23]
    assert below["ratio_range"] == [below["ratio"], below["ratio"]]  # one repetition: its ratio, as printed


def test_the_verdict_fails_on_a_row_below_its_floor_or_an_error_and_not_on_a_skipped_row():
    rows = [
        {"scenario": "send", "floor_held": True},
        {"scenario": "send-pipelined", "floor_held": None},
        {"scenario": "io-bound-serial", "floor_held": None},
    ]
    ok = verdict(rows, {"routing": "too long"})
    assert ok == {
        "passed": True,
        "below_floor": [],
        "errors": [],
        "checked": ["send"],
        "left_out": {"routing": "too long"},
    }
    failed = verdict(rows + [{"scenario": "request-reply", "floor_held": False}], {})
    assert (failed["passed"], failed["below_floor"]) == (False, ["request-reply"])
    errored = verdict(rows + [{"scenario": "io-bound", "floor_held": None, "error": "RuntimeError: x"}], {})
    assert (errored["passed"], errored["errors"]) == (False, ["io-bound"])


def test_quick_sizes_shrink_the_defaults_but_not_what_the_command_line_gave():
    small = shrink(Params())
    assert small.repeat == 1 and small.messages == QUICK["messages"] < Params().messages
    assert small.backlog < Params().backlog and small.ended_dialogs < Params().ended_dialogs
    assert small.readers == Params().readers  # not a size: kept
    given = shrink(Params(messages=123, repeat=3), {"messages", "repeat"})
    assert (given.messages, given.repeat, given.backlog) == (123, 3, QUICK["backlog"])
    for name, value in QUICK.items():  # every quick size is smaller than (or as small as) the default
        assert value <= getattr(Params(), name), name


def test_left_out_scenarios_run_when_named():
    scenarios = load_scenarios()
    out = left_out(scenarios, [])
    assert set(out) == {"limits", "analytics", "routing", "routing-secured"} and all(out.values())
    assert left_out(scenarios, ["routing"]) == {} == left_out(scenarios, ["send"])


def test_the_default_run_takes_medians_of_5():
    assert Params().repeat == 5


def test_every_row_with_a_target_has_a_floor_on_its_wrong_side_and_every_row_its_baseline_code():
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    baselines = docs[docs.index("## Baselines") : docs.index("## Latest results")]
    for s in load_scenarios().values():
        for r in s.rows:
            assert (r.floor is None) == (r.target is None), r.name
            assert r.baseline_code, r.name
            for part in r.baseline_code.split("; "):
                path, _, name = part.split(" ")[0].partition(":")
                text = (ROOT / path).read_text()
                top = name.split(".")[0]
                assert re.search(rf"^(class |def |){re.escape(top)}\b", text, re.M), f"{r.name}: {part}"
                assert part.split(" ")[0] in baselines, f"{r.name}: {part} is not in docs/benchmarks.md"
            line = next(x for x in baselines.splitlines() if x.startswith(f"| {r.name} |"))
            floor_cell = line.rstrip(" |").rsplit("|", 1)[1].replace("≥", ">=").replace("≤", "<=")
            expected = (
                "-" if r.floor is None else f"{r.floor.of} {'<=' if r.floor.at_most else '>='} {r.floor.limit:,g}"
            )
            assert floor_cell.strip().startswith(expected), f"{r.name}: docs say {floor_cell!r}, the row {expected!r}"


@pytest.mark.parametrize(
    "name, passing, failing",
    [
        ("send", {"ratio": 0.8, "kbroker_detail": {"cpu_ms_per_msg": 0.4}}, {"ratio": 0.3}),
        (
            "request-reply-batched",
            {"ratio": 0.5, "kbroker_detail": {"cpu_ms_per_msg": 0.25}},
            {"ratio": 0.6, "kbroker_detail": {"cpu_ms_per_msg": 5.0}},
        ),
        ("activation-drain", {"ratio": 1.2}, {"ratio": 4.0}),
        ("backlog-rss", {"kbroker": 300.0, "baseline": 45.0}, {"kbroker": 900.0, "baseline": 45.0}),
        ("activation-latency", {"kbroker": 1000.0}, {"kbroker": 5000.0}),
    ],
)
def test_a_row_meeting_its_target_holds_its_floor_and_a_far_worse_one_does_not(name, passing, failing):
    row = next(r for s in load_scenarios().values() for r in s.rows if r.name == name)
    assert row.floor is not None
    assert row.floor.holds(passing) is True and row.floor.holds(failing) is False


def test_carried_rows_are_judged_by_todays_target_not_a_retired_one(tmp_path):
    machine = {
        "cpu": "x",
        "cores": 2,
        "memory_gb": 1,
        "os": "y",
        "load_average": [0, 0, 0],
        "python": "p",
        "kafka": "k",
        "confluent_kafka": "c",
        "kbroker": "v",
    }
    retired = {
        "scenario": "request-reply",
        "unit": "msg/s",
        "kbroker": 2000.0,
        "baseline": 3000.0,
        "ratio": 0.66667,
        "ratio_definition": "kbroker/baseline",
        "target": ">= 20,000 msg/s and ratio >= 0.5",
        "met": False,
        "runs": [],
        "notes": "",
        "range": {"kbroker": [1900.0, 2100.0], "baseline": [2800.0, 3100.0]},
        "kbroker_detail": {"cpu_ms_per_msg": 0.5},
    }
    old = {
        "date": "2026-01-01T00:00:00+00:00",
        "command": "kbroker bench",
        "duration_s": 1,
        "params": {"repeat": 3},
        "machine": machine,
        "results": [retired],
    }
    write_results(old, tmp_path)
    merged = merge_previous({**old, "results": []}, tmp_path / "latest.json")
    row = merged["results"][0]
    assert (row["target"], row["met"], row["floor"], row["floor_held"]) == (
        "ratio >= 0.5",
        True,
        "ratio >= 0.1 and CPU <= 1.5 ms/msg",
        True,
    )
    assert row["baseline_code"].startswith("kbroker/bench/scenarios/reply.py:baseline_responder")
    table = results_markdown(merged)
    assert "20,000" not in table and "runs: kbroker 1,900-2,100, baseline 2,800-3,100" in table
