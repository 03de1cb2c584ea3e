"""`kbroker bench`: a small run against the session's broker (the harness's bookkeeping is tested in
tests/unit/test_bench_harness.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from kbroker.bench.harness import (
    RESULTS_END,
    RESULTS_START,
)
from tests.helpers import KBROKER, ROOT, run_bench_cli


def test_a_small_run_reports_both_sides_and_their_ratio(kafka_bootstrap, tmp_path):
    out, docs = tmp_path / "results", tmp_path / "benchmarks.md"
    shutil.copyfile(ROOT / "docs" / "benchmarks.md", docs)  # the shipped file has the markers
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap}
    started = time.monotonic()
    stdout, _ = run_bench_cli(
        [
            KBROKER,
            "bench",
            "send",
            "backlog-rss",
            "ended-dialogs",
            "--repeat",
            "1",
            "--messages",
            "500",
            "--conversations",
            "100",
            "--backlog",
            "2000",
            "--ended-dialogs",
            "500",
            "--json",
            "--out",
            str(out),
            "--docs",
            str(docs),
        ],
        env,
        timeout=120,
    )
    assert time.monotonic() - started < 60, "the small benchmark run should stay under a minute"

    doc = json.loads(stdout)
    rows = {r["scenario"]: r for r in doc["results"]}
    assert set(rows) == {"send", "send-pipelined", "backlog-rss", "ended-dialogs-rss", "conversations-view"}
    for name in ("send", "backlog-rss", "ended-dialogs-rss", "conversations-view"):
        r = rows[name]
        assert "error" not in r and "skipped_reason" not in r, r
        assert r["kbroker"] > 0 and r["baseline"] > 0, r
        assert r["ratio_definition"] == "kbroker/baseline"
        assert r["ratio"] == pytest.approx(r["kbroker"] / r["baseline"], rel=1e-3)
        assert isinstance(r["met"], bool)
        assert len(r["runs"]) == 1 and {"kbroker", "baseline"} <= set(r["runs"][0])
    assert rows["send"]["unit"] == "msg/s" and rows["backlog-rss"]["unit"] == "MB"
    assert rows["ended-dialogs-rss"]["runs"][0]["kbroker_detail"]["endpoints_kept"] == 1  # the live one
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
    section = text[text.index(RESULTS_START) : text.index(RESULTS_END)]
    assert "| send | msg/s |" in section and "| backlog-rss | MB |" in section
    assert doc["date"] in section
    assert text.startswith("# Benchmarks")  # the rest of the file is kept


def test_the_limit_rows_run_kafkas_own_tools_beside_kbroker_on_the_same_broker(kafka_bootstrap, tmp_path):
    out, docs = tmp_path / "results", tmp_path / "benchmarks.md"
    shutil.copyfile(ROOT / "docs" / "benchmarks.md", docs)
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap}
    stdout, _ = run_bench_cli(
        [KBROKER, "bench", "limits", "--repeat", "1", "--messages", "2000", "--conversations", "100",
         "--json", "--out", str(out), "--docs", str(docs)],
        env,
        timeout=240,
    )  # fmt: skip
    rows = {r["scenario"]: r for r in json.loads(stdout)["results"]}
    assert set(rows) == {"limit-produce", "limit-latency"}
    for r in rows.values():
        assert "error" not in r and "skipped_reason" not in r, r
        assert r["kbroker"] > 0 and r["baseline"] >= 0 and r["target"] is None, r
    produced = rows["limit-produce"]["runs"][0]
    assert rows["limit-produce"]["baseline"] > 0
    assert produced["baseline_detail"]["records"] == 2000  # what ProducerPerformance said it sent
    for side in ("kbroker", "baseline"):
        hops = rows["limit-latency"]["runs"][0][f"{side}_detail"]
        # Kafka's tool prints its percentiles in whole ms: a sub-millisecond p50 is 0, its mean is not.
        assert hops["records"] >= 500 and hops["p99_ms"] >= hops["p50_ms"] >= 0 and hops["mean_ms"] > 0, hops


def test_the_quick_check_judges_each_row_against_its_floor_and_writes_only_quick_json(kafka_bootstrap, tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap}
    proc = subprocess.run(
        [
            KBROKER,
            "bench",
            "--quick",
            "send",
            "--messages",
            "200",
            "--conversations",
            "20",
            "--json",
            "--quiet",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    rows = {r["scenario"]: r for r in doc["results"]}
    assert set(rows) == {"send", "send-pipelined"}
    assert doc["params"]["repeat"] == 1 and doc["params"]["messages"] == 200  # quick, the option kept
    send = rows["send"]
    cpu = send["kbroker_detail"]["cpu_ms_per_msg"]  # the floor bounds kbroker's own CPU a message too
    assert send["floor"] == "ratio >= 0.25 and CPU <= 0.8 ms/msg"
    assert send["floor_held"] == (send["ratio"] >= 0.25 and cpu <= 0.8)
    assert send["range"]["kbroker"] == [send["kbroker"], send["kbroker"]]  # one repetition: its own range
    assert send["baseline_code"].startswith("kbroker/bench/scenarios/send.py:BaselineSender.send")
    verdict = doc["quick"]
    assert verdict["left_out"] == {} and "send" in verdict["checked"]
    # The exit status is the verdict: a loaded machine may push a row under its floor, never both ways.
    assert verdict["passed"] == (proc.returncode == 0)
    assert verdict["passed"] == all(r["floor_held"] is not False for r in rows.values())
    assert json.loads((out / "quick.json").read_text()) == doc
    assert not (out / "latest.json").exists()  # the published results are not touched
