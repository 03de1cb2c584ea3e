"""`kbroker bench scale` at small sizes on the session's broker: each curve's points are measured
(no point failed), the results file holds them, and the workers it started are gone. Minutes, so
opt-in (`make test-long`, run by CI after `make test`)."""

from __future__ import annotations

import json
import os
import sys

import psutil
import pytest

from tests.helpers import ROOT, run_bench_cli

pytestmark = pytest.mark.bench_scale


@pytest.mark.timeout(600)
def test_the_scaling_curves_are_measured_at_small_sizes(kafka_bootstrap, tmp_path):
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    stdout, _ = run_bench_cli(
        [sys.executable, "-m", "kbroker", "bench", "scale", "--queues", "2,4", "--dialogs", "300",
         "--workers", "1,2", "--drain-messages", "600", "--ramp-up", "1", "--json",
         "--out", str(tmp_path / "results"), "--no-docs", "--quiet"], env, timeout=540)

    doc = json.loads(stdout)
    assert doc == json.loads((tmp_path / "results" / "scale.json").read_text())
    curves = {c: d["points"] for c, d in doc["curves"].items()}
    for points in curves.values():
        assert not [p for p in points if "error" in p], points

    queues = curves["queues"]
    assert [p["queues"] for p in queues] == [2, 4]
    for p in queues:
        # Each queue is a topic of 4 partitions; the namespace has its system topics beside.
        assert p["namespace_partitions"] > 4 * p["queues"] and p["worker_start_s"] > 0 and p["worker_rss_mb"] > 0
        assert p["activation_ms"]["samples"] == p["queues"] and 0 < p["activation_ms"]["p50"] <= p["activation_ms"]["p99"]
        assert p["tick_ms"]["ticks"] >= 2 and p["tick_ms"]["p50"] >= 0
    assert queues[1]["namespace_partitions"] - queues[0]["namespace_partitions"] == 2 * 4

    (dialogs,) = curves["dialogs"]
    assert dialogs["dialogs"] == 300
    for side in ("send", "receive"):
        assert dialogs[side]["msg_per_s"] > 0 and dialogs[side]["peak_rss_mb"] > 0

    workers = curves["workers"]
    assert [(p["workers"], p["messages"]) for p in workers] == [(1, 600), (2, 600)]
    assert workers[0]["monitor_owners"] == 1 and all(p["msg_per_s"] > 0 for p in workers)

    # The workers the curves started were stopped.
    left = [p for p in psutil.process_iter(["cmdline"])
            if "worker" in (p.info["cmdline"] or []) and any("bench-scale" in a for a in p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
