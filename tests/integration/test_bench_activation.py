"""`kbroker bench activation-latency activation-drain` at tiny sizes, on the session's broker: a real
worker is started (and stopped) by each scenario; the JSON has the usual row shape."""

from __future__ import annotations

import json
import os
import sys

import psutil
import pytest

from tests.helpers import ROOT, run_bench_cli


@pytest.mark.long  # 35 s, a worker started per scenario: `make test-long`
def test_the_activation_scenarios_report_latency_and_drain_time(kafka_bootstrap, tmp_path):
    env = {
        **os.environ,
        "KBROKER_BOOTSTRAP": kafka_bootstrap,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    stdout, _ = run_bench_cli(
        [
            sys.executable,
            "-m",
            "kbroker",
            "bench",
            "activation-latency",
            "activation-drain",
            "--repeat",
            "1",
            "--samples",
            "2",
            "--drain-messages",
            "300",
            "--conversations",
            "30",
            "--max-readers",
            "2",
            "--ramp-up",
            "1",
            "--json",
            "--out",
            str(tmp_path / "results"),
            "--no-docs",
            "--quiet",
        ],
        env,
        timeout=150,
    )

    doc = json.loads(stdout)
    assert doc["params"]["samples"] == 2 and doc["params"]["drain_messages"] == 300
    rows = {r["scenario"]: r for r in doc["results"]}
    assert set(rows) == {"activation-latency", "activation-drain"}
    for r in rows.values():
        assert "error" not in r and "skipped_reason" not in r, r
        assert r["kbroker"] > 0 and r["baseline"] > 0, r
        assert r["ratio_definition"] == "kbroker/baseline"
        assert r["ratio"] == pytest.approx(r["kbroker"] / r["baseline"], rel=1e-3)
        assert isinstance(r["met"], bool) and r["summary"]
        assert len(r["runs"]) == 1

    lat = rows["activation-latency"]
    assert lat["unit"] == "ms (p99)" and lat["target"] == "p99 <= 1,000 ms"
    for side in ("kbroker", "baseline"):
        d = lat[f"{side}_detail"]
        assert 0 < d["p50_ms"] <= d["p99_ms"] and d["samples"] == 2, d
        assert lat["latency_ms"][side] == {"p50": d["p50_ms"], "p99": d["p99_ms"]}
    assert lat["kbroker"] == lat["kbroker_detail"]["p99_ms"]

    drain = rows["activation-drain"]
    assert drain["unit"] == "s" and drain["target"] == "ratio <= 1.2"
    run = drain["runs"][0]
    assert (run["messages"], run["max_queue_readers"], run["ramp_up_s"]) == (300, 2, 1.0)
    assert run["kbroker_detail"]["seconds"] > 0 and run["baseline_detail"]["msg_per_s"] > 0
    assert run["kbroker_detail"]["readers_at_s"].get("1") is not None, run  # a reader was activated

    # Each scenario stopped the worker it started.
    workers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "worker" in (p.info["cmdline"] or []) and any("bench-act" in a for a in p.info["cmdline"] or [])
    ]
    assert not workers, [p.info["cmdline"] for p in workers]
