"""The bench harness's bookkeeping: scenario names, the ratio of medians, and results carried over
from an earlier run. The small `kbroker bench` run against the broker is in
tests/integration/test_bench.py."""

from __future__ import annotations

import pytest

from kbroker.bench.harness import Row, load_scenarios, resolve_names, summarise
from kbroker.cli.bench_scenarios import SCENARIO_NAMES


def test_the_cli_knows_every_scenario_and_row():
    known = load_scenarios()
    rows = {r.name for s in known.values() for r in s.rows}
    assert set(SCENARIO_NAMES) == set(known) | rows | {"scale"}  # scale: curves, not a scenario (bench/scale/run.py)
    assert resolve_names(["send-pipelined"]) == ["send"]
    assert resolve_names([]) == list(known)
    with pytest.raises(ValueError, match="unknown scenario"):
        resolve_names(["nope"])


def test_ratio_is_the_ratio_of_the_medians():
    runs = [
        {"kbroker": 10.0, "baseline": 40.0},
        {"kbroker": 30.0, "baseline": 20.0},
        {"kbroker": 20.0, "baseline": 30.0},
    ]
    row = summarise(Row("x", "msg/s", "ratio >= 0.8", check=lambda r: r["ratio"] >= 0.8), runs)
    assert (row["kbroker"], row["baseline"], row["ratio"], row["met"]) == (20.0, 30.0, 0.66667, False)
    latency = summarise(Row("y", "ms", None, ratio="baseline/kbroker"), runs)
    assert latency["ratio"] == 1.5 and latency["met"] is None
    skipped = summarise(
        Row("z", "msg/s", "ratio >= 0.8", check=lambda r: True),
        [{"kbroker": None, "baseline": 5.0, "skipped_reason": "not yet"}],
    )
    assert skipped["ratio"] is None and skipped["met"] is None and skipped["skipped_reason"] == "not yet"


def test_rows_of_scenarios_not_run_are_carried_over_from_the_previous_results(tmp_path):
    from kbroker.bench.harness import merge_previous, results_markdown, write_results

    def row(name: str, value: float) -> dict:
        return {
            "scenario": name,
            "unit": "s",
            "kbroker": value,
            "baseline": value,
            "ratio": 1.0,
            "ratio_definition": "kbroker/baseline",
            "target": None,
            "met": None,
            "runs": [],
            "notes": "",
        }

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
    old = {
        "date": "2026-01-01T00:00:00+00:00",
        "command": "kbroker bench send activation-drain",
        "duration_s": 1,
        "params": {"repeat": 1},
        "machine": machine,
        "results": [row("activation-drain", 9.0), row("send", 1.0), row("send-pipelined", 2.0)],
    }
    write_results(old, tmp_path)
    new = {
        **old,
        "date": "2026-02-02T00:00:00+00:00",
        "command": "kbroker bench activation-drain",
        "results": [row("activation-drain", 5.0)],
    }
    merged = merge_previous(new, tmp_path / "latest.json")
    assert [r["scenario"] for r in merged["results"]] == ["send", "send-pipelined", "activation-drain"]
    assert merged["results"][2]["kbroker"] == 5.0 and "carried_from" not in merged["results"][2]
    assert merged["results"][0]["carried_from"] == {"date": old["date"], "command": old["command"]}
    table = results_markdown(merged)
    assert "from the run of 2026-01-01" in table and table.count("from the run of 2026-01-01") == 2
    assert merge_previous(new, tmp_path / "missing.json") is new
