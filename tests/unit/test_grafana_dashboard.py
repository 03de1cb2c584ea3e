"""compose/grafana-kbroker.json, the Grafana dashboard built on kbroker's metrics: valid JSON whose
every query names only metrics kbroker exports (a renamed metric fails here, not on a user's
screen), with the namespace variable on every panel."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry, generate_latest

import kbroker.metrics as families
from kbroker.worker.web.metrics import WorkerCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "compose" / "grafana-kbroker.json"
METRIC = re.compile(r"\b(kbroker_[a-z0-9_]+)")


def exported() -> set[str]:
    """Every sample name kbroker's processes can export."""
    out: set[str] = set()
    for family in vars(families).values():
        describe = getattr(family, "describe", None)
        if callable(describe) and hasattr(family, "_name"):
            for metric in describe():
                out |= {metric.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count", "_created")}
    registry = CollectorRegistry()
    registry.register(
        WorkerCollector(
            "ns",
            "w",
            lambda: [("Q", {"state": "INACTIVE"})],
            lambda: [{"queue": "Q"}],
            1,
            lambda: ({"d": (1, 1.0)}, {"d": "CONNECTED"}),
        )
    )
    out |= set(re.findall(r"^(kbroker_[a-z0-9_]+)", generate_latest(registry).decode(), re.M))
    return out


def test_every_panel_queries_only_metrics_kbroker_exports_in_the_chosen_namespaces():
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    known = exported()
    assert {"kbroker_messages_sent_total", "kbroker_queue_backlog_messages", "kbroker_commit_seconds_bucket"} <= known
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace"} <= variables
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= len(dashboard["panels"]) >= 10
    for expr in exprs:
        used = set(METRIC.findall(expr))
        assert used and used <= known, (expr, used - known)
        assert 'namespace=~"$namespace"' in expr, expr
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
