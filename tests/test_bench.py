"""`kbroker bench`: a small run against the session's broker, and the harness's bookkeeping."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from kbroker.bench.harness import (
    RESULTS_END,
    RESULTS_START,
    Row,
    load_scenarios,
    resolve_names,
    summarise,
)
from kbroker.cli.bench import SCENARIO_NAMES

from .conftest import KBROKER, ROOT, run_bench_cli


def test_a_small_run_reports_both_sides_and_their_ratio(kafka_bootstrap, tmp_path):
    out, docs = tmp_path / "results", tmp_path / "benchmarks.md"
    shutil.copyfile(ROOT / "docs" / "benchmarks.md", docs)  # the shipped file has the markers
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap}
    started = time.monotonic()
    stdout, _ = run_bench_cli(
        [KBROKER, "bench", "send", "backlog-rss", "--repeat", "1", "--messages", "500",
         "--conversations", "100", "--backlog", "2000", "--json", "--out", str(out), "--docs", str(docs)],
        env, timeout=120)
    assert time.monotonic() - started < 60, "the small benchmark run should stay under a minute"

    doc = json.loads(stdout)
    rows = {r["scenario"]: r for r in doc["results"]}
    assert set(rows) == {"send", "send-pipelined", "backlog-rss"}
    for name in ("send", "backlog-rss"):
        r = rows[name]
        assert "error" not in r and "skipped_reason" not in r, r
        assert r["kbroker"] > 0 and r["baseline"] > 0, r
        assert r["ratio_definition"] == "kbroker/baseline"
        assert r["ratio"] == pytest.approx(r["kbroker"] / r["baseline"], rel=1e-3)
        assert isinstance(r["met"], bool)
        assert len(r["runs"]) == 1 and {"kbroker", "baseline"} <= set(r["runs"][0])
    assert rows["send"]["unit"] == "msg/s" and rows["backlog-rss"]["unit"] == "MB"
    # Pipelined SEND needs Broker.transaction(): either measured or said to be missing.
    pipelined = rows["send-pipelined"]
    assert pipelined["baseline"] > 0
    if pipelined.get("skipped_reason"):
        assert pipelined["kbroker"] is None
    else:
        assert pipelined["ratio"] == pytest.approx(pipelined["kbroker"] / pipelined["baseline"], rel=1e-3)
    for key in ("cpu", "cores", "memory_gb", "python", "kafka", "kbroker"):
        assert doc["machine"][key], key

    # The results file holds what was printed; the docs table was rewritten between the markers.
    assert json.loads((out / "latest.json").read_text()) == doc
    text = docs.read_text()
    section = text[text.index(RESULTS_START):text.index(RESULTS_END)]
    assert "| send | msg/s |" in section and "| backlog-rss | MB |" in section
    assert doc["date"] in section
    assert text.startswith("# Benchmarks")  # the rest of the file is kept


def test_the_cli_knows_every_scenario_and_row():
    known = load_scenarios()
    rows = {r.name for s in known.values() for r in s.rows}
    assert set(SCENARIO_NAMES) == set(known) | rows
    assert resolve_names(["send-pipelined"]) == ["send"]
    assert resolve_names([]) == list(known)
    with pytest.raises(ValueError, match="unknown scenario"):
        resolve_names(["nope"])


def test_ratio_is_the_ratio_of_the_medians():
    runs = [{"kbroker": 10.0, "baseline": 40.0}, {"kbroker": 30.0, "baseline": 20.0},
            {"kbroker": 20.0, "baseline": 30.0}]
    row = summarise(Row("x", "msg/s", "ratio >= 0.8", check=lambda r: r["ratio"] >= 0.8), runs)
    assert (row["kbroker"], row["baseline"], row["ratio"], row["met"]) == (20.0, 30.0, 0.66667, False)
    latency = summarise(Row("y", "ms", None, ratio="baseline/kbroker"), runs)
    assert latency["ratio"] == 1.5 and latency["met"] is None
    skipped = summarise(Row("z", "msg/s", "ratio >= 0.8", check=lambda r: True),
                        [{"kbroker": None, "baseline": 5.0, "skipped_reason": "not yet"}])
    assert skipped["ratio"] is None and skipped["met"] is None and skipped["skipped_reason"] == "not yet"


def test_rows_of_scenarios_not_run_are_carried_over_from_the_previous_results(tmp_path):
    from kbroker.bench.harness import merge_previous, results_markdown, write_results

    def row(name: str, value: float) -> dict:
        return {"scenario": name, "unit": "s", "kbroker": value, "baseline": value, "ratio": 1.0,
                "ratio_definition": "kbroker/baseline", "target": None, "met": None, "runs": [], "notes": ""}

    machine = {"cpu": "x", "cores": 2, "memory_gb": 1, "os": "y", "load_average": [0, 0, 0], "python": "p",
               "kafka": "k", "confluent_kafka": "c", "kbroker": "v"}
    old = {"date": "2026-01-01T00:00:00+00:00", "command": "kbroker bench send activation-drain",
           "duration_s": 1, "params": {"repeat": 1}, "machine": machine,
           "results": [row("activation-drain", 9.0), row("send", 1.0), row("send-pipelined", 2.0)]}
    write_results(old, tmp_path)
    new = {**old, "date": "2026-02-02T00:00:00+00:00", "command": "kbroker bench activation-drain",
           "results": [row("activation-drain", 5.0)]}
    merged = merge_previous(new, tmp_path / "latest.json")
    assert [r["scenario"] for r in merged["results"]] == ["send", "send-pipelined", "activation-drain"]
    assert merged["results"][2]["kbroker"] == 5.0 and "carried_from" not in merged["results"][2]
    assert merged["results"][0]["carried_from"] == {"date": old["date"], "command": old["command"]}
    table = results_markdown(merged)
    assert "from the run of 2026-01-01" in table and table.count("from the run of 2026-01-01") == 2
    assert merge_previous(new, tmp_path / "missing.json") is new
