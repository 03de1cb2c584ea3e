"""`kbroker monitors` as a plain table: a row whose owning worker was degraded says so, and why."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from kbroker.cli import main
from kbroker.cli.worker import degraded_cell


def row(queue: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "queue": queue,
        "state": "INACTIVE",
        "activation": "ON",
        "readers": 0,
        "max_queue_readers": 3,
        "tasks_waiting": 0,
        "backlog": 0,
        "ready_groups": 0,
        "last_activated_time": None,
        "last_empty_rowset_time": None,
        "worker": "w1",
        "degraded": False,
        "degraded_reasons": [],
    }
    return {**base, **extra}


REASON = {"component": "catalog refresh", "error": "BrokerUnavailableError: no broker answered", "failures": 3}


def test_degraded_cell_names_each_failing_component() -> None:
    assert degraded_cell(row("A")) == ""
    assert degraded_cell(row("A", degraded=True)) == "DEGRADED"
    cell = degraded_cell(row("A", degraded=True, degraded_reasons=[REASON, {"component": "tick", "error": "x" * 200}]))
    assert cell.startswith("DEGRADED (catalog refresh: BrokerUnavailableError: no broker answered; tick: ")
    assert "x" * 60 in cell and "x" * 61 not in cell  # a long error is cut short in the table


def test_the_plain_monitors_table_has_a_degraded_column(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbroker.worker.web import views

    rows = [
        row("HealthyQueue"),
        row("SickQueue", degraded=True, degraded_reasons=[REASON]),
        row("PausedQueue", activation="OFF", backlog=200, ready_groups=7),
    ]
    monkeypatch.setattr(views, "monitor_rows", lambda bootstrap, namespace: rows)
    result = CliRunner().invoke(main, ["monitors", "--bootstrap", "127.0.0.1:1", "--namespace", "n"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["queue", "state"])
    assert header.split()[-1] == "degraded"
    healthy = next(line for line in lines if line.startswith("HealthyQueue"))
    sick = next(line for line in lines if line.startswith("SickQueue"))
    assert "DEGRADED" not in healthy and healthy.split()[-1] == "w1"
    assert "DEGRADED (catalog refresh: BrokerUnavailableError: no broker answered)" in sick
    paused = next(line for line in lines if line.startswith("PausedQueue")).split()
    assert paused[1:3] == ["INACTIVE", "OFF"] and "200" in paused and "7" in paused  # activation OFF, real counts
