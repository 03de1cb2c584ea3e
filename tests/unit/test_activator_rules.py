"""The external activator's pure parts: its rules (fake clock), its config file and the
`kbroker activator check` command line, and its log lines. The end-to-end tests against the broker
are in tests/integration/test_activator.py."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from kbroker.activator.config import load_config
from kbroker.activator.notification import Notification, parse
from kbroker.activator.rules import (
    AT_MAX,
    BACKOFF,
    MIN_CONCURRENCY,
    NO_WORK,
    NOTIFIED,
    OTHER_NAMESPACE,
    SATISFIED,
    STALE,
    UNKNOWN_QUEUE,
    Decision,
    Limits,
    Rules,
)
from kbroker.errors import DefinitionError
from tests.helpers import ROOT

READER = ROOT / "examples" / "activator" / "expense_reader.py"
EXAMPLE_CONFIG = ROOT / "examples" / "activator" / "activator.yaml"


def note(queue="Q", *, backlog=5, ready_groups=2, t=1000.0, ns=None) -> Notification:
    return Notification(queue=queue, namespace=ns, backlog=backlog, ready_groups=ready_groups, time=t)


# --- rules (pure, fake clock) -----------------------------------------------------------------


def test_each_notification_starts_one_until_max():
    rules = Rules({"Q": Limits(0, 3)})
    running, now = 0, 1000.0
    decisions = []
    for _ in range(5):  # a burst: the running count grows as the runner starts copies
        d = rules.on_notification(note(t=now), running, now)
        decisions.append(d.reason)
        running += d.start
    assert running == 3
    assert decisions == [NOTIFIED, NOTIFIED, NOTIFIED, AT_MAX, AT_MAX]
    # A slot frees up: the next notification fills it, and only it.
    assert rules.on_notification(note(t=now), 2, now) == Decision(1, NOTIFIED)


def test_notifications_that_start_nothing():
    rules = Rules({"Q": Limits(0, 2)}, namespace="ns", stale_after=300)
    now = 10_000.0
    assert rules.on_notification(note("Other", t=now), 0, now) == Decision(0, UNKNOWN_QUEUE)
    assert rules.on_notification(note(t=now, backlog=0), 0, now) == Decision(0, NO_WORK)
    assert rules.on_notification(note(t=now, ns="elsewhere"), 0, now) == Decision(0, OTHER_NAMESPACE)
    assert rules.on_notification(note(t=now - 301), 0, now) == Decision(0, STALE)
    assert rules.on_notification(note(t=now - 299), 0, now) == Decision(1, NOTIFIED)
    # Counts the worker did not send (-1) and a missing time do not block a start.
    assert rules.on_notification(note(t=None, backlog=-1, ready_groups=-1), 0, now) == Decision(1, NOTIFIED)
    # ready_groups = 0 is only logged (see rules.py, rule 2).
    assert rules.on_notification(note(t=now, ready_groups=0), 0, now) == Decision(1, NOTIFIED)


def test_min_concurrency_is_kept_and_never_exceeds_max():
    rules = Rules({"Q": Limits(2, 3)}, restart_delay=1.0)
    assert rules.on_tick("Q", 0, 0.0) == Decision(2, MIN_CONCURRENCY)
    assert rules.on_tick("Q", 2, 0.0) == Decision(0, SATISFIED)
    assert rules.on_tick("Q", 3, 0.0) == Decision(0, SATISFIED)
    assert rules.on_tick("Unknown", 0, 0.0) == Decision(0, UNKNOWN_QUEUE)


def test_restart_waits_and_backs_off_on_consecutive_failures():
    rules = Rules({"Q": Limits(1, 1)}, restart_delay=1.0, backoff_max=5.0)
    clock = 100.0
    waits = []
    for _ in range(5):  # the program fails every time it starts
        rules.on_exit("Q", 1, clock)
        start = clock
        while rules.on_tick("Q", 0, clock) == Decision(0, BACKOFF):
            clock += 0.25
        assert rules.on_tick("Q", 0, clock) == Decision(1, MIN_CONCURRENCY)
        waits.append(clock - start)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]  # doubling, capped by backoff_max
    # A clean exit resets the doubling: the next replacement waits restart_delay only.
    rules.on_exit("Q", 0, clock)
    assert rules.on_tick("Q", 0, clock + 0.5).reason == BACKOFF
    assert rules.on_tick("Q", 0, clock + 1.0).start == 1
    rules.on_exit("Q", -9, clock + 2)  # killed by a signal counts as a failure
    assert rules.next_restart("Q") == clock + 3.0


def test_backoff_does_not_delay_notifications():
    rules = Rules({"Q": Limits(0, 1)}, restart_delay=10.0)
    rules.on_exit("Q", 1, 50.0)
    assert rules.on_notification(note(t=50.0), 0, 51.0) == Decision(1, NOTIFIED)


def test_limits_refuse_min_above_max():
    with pytest.raises(ValueError):
        Limits(3, 2)
    with pytest.raises(ValueError):
        Limits(0, 0)


def test_parse_notifications_and_ignore_everything_else():
    ok = {
        "event": "QUEUE_ACTIVATION",
        "queue": "ExpenseQueue",
        "namespace": "ns",
        "backlog": 7,
        "ready_groups": 3,
        "time": 1_700_000_000_500,
    }
    assert parse(b"ExpenseQueue", orjson.dumps(ok)) == Notification("ExpenseQueue", "ns", 7, 3, 1_700_000_000.5)
    assert parse(b"ExpenseQueue", orjson.dumps({"event": "QUEUE_DISABLED", "queue": "ExpenseQueue"})) is None
    assert parse(b"x", b"not json") is None
    assert parse(b"x", None) is None
    assert parse(b"x", b"[1, 2]") is None
    # The queue falls back to the key; missing counts read as unknown (-1).
    assert parse(b"K", orjson.dumps({"event": "QUEUE_ACTIVATION"})) == Notification("K", None, -1, -1, None)


# --- config -----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "activator.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_config_defaults_and_command_forms(tmp_path):
    p = write(
        tmp_path,
        """
namespace: sales
applications:
  - queue: ExpenseQueue
    command: "python 'my reader.py' --top 10"
    env: {PORT: 8080, MODE: fast}
    cwd: work
  - queue: EmployeeQueue
    name: employees
    command: [python, -c, "print(1)"]
    min_concurrency: 1
    max_concurrency: 4
    enabled: false
""",
    )
    cfg = load_config(p)
    a, b = cfg.applications
    assert a.command == ["python", "my reader.py", "--top", "10"]
    assert (a.min_concurrency, a.max_concurrency, a.label) == (0, 1, "ExpenseQueue")
    assert a.env == {"PORT": "8080", "MODE": "fast"}
    assert a.cwd == str((tmp_path / "work").resolve())
    assert (b.label, b.min_concurrency, b.max_concurrency, b.cwd) == ("employees", 1, 4, None)
    assert cfg.namespace == "sales" and cfg.shutdown_grace == 5.0
    assert list(cfg.enabled()) == ["ExpenseQueue"]


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "applications:\n  - queue: Q\n    command: [x]\n    max_concurrency: 0\n",
            "application Q: max_concurrency: Input should be greater than or equal to 1",
        ),
        (
            "applications:\n  - queue: Q\n    name: reader\n    command: [x]\n    min_concurrency: 2\n",
            "application reader: min_concurrency (2) exceeds max_concurrency (1)",
        ),
        (
            "applications:\n  - queue: Q\n    command: [x]\n    max_concurency: 3\n",
            "application Q: unknown field 'max_concurency'",
        ),
        ("applications:\n  - queue: Q\n", "application Q: missing required field 'command'"),
        ("applications:\n  - queue: Q\n    command: []\n", "application Q: command: command must name a program"),
        ('applications:\n  - queue: "bad\\tqueue"\n    command: [x]\n', "application bad\tqueue: queue: queue name"),
        (
            "applications:\n  - queue: Q\n    command: [x]\n    env: {DEBUG: yes}\n",
            "application Q: env.DEBUG: must be a string",
        ),
        (
            "applications:\n  - queue: Q\n    command: [x]\n  - queue: Q\n    name: two\n    command: [y]\n",
            "application two: queue 'Q' already has application Q",
        ),
        ("applications:\n  - command: [x]\n", "application #1: missing required field 'queue'"),
        ("applications: []\n", "'applications' must be a non-empty list"),
        ("applications:\n  - queue: Q\n    command: [x]\nshutdown_grace: -1\n", "shutdown_grace"),
        ("namespace: 'no spaces'\napplications:\n  - queue: Q\n    command: [x]\n", "namespace"),
        ("applications:\n  - queue: Q\n    command: [x]\n    command: [y]\n", "invalid YAML at line 4"),
    ],
)
def test_config_errors_name_file_application_and_field(tmp_path, body, expected):
    p = write(tmp_path, body)
    with pytest.raises(DefinitionError) as err:
        load_config(p)
    assert str(err.value).startswith(f"{p}: ")
    assert expected in str(err.value)


def test_the_example_config_is_valid():
    cfg = load_config(EXAMPLE_CONFIG)
    (app,) = cfg.applications
    assert app.queue == "ExpenseQueue" and app.max_concurrency == 2
    assert Path(app.cwd, app.command[1]).resolve() == READER


def test_cli_check_prints_applications_and_one_line_errors(tmp_path):
    # In-process through click's runner: `activator check` touches no broker, and a subprocess per
    # call would cost the unit suite seconds of interpreter start-up.
    from click.testing import CliRunner

    from kbroker.cli import main

    runner = CliRunner()
    ok = runner.invoke(main, ["activator", "check", "--config", str(EXAMPLE_CONFIG), "--json"])
    assert ok.exit_code == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert [a["name"] for a in doc["applications"]] == ["expense-reader"]
    assert doc["applications"][0]["command"] == ["python", "expense_reader.py"]
    text = runner.invoke(main, ["activator", "check", "--config", str(EXAMPLE_CONFIG)])
    assert "expense-reader: queue ExpenseQueue, 0..2 copies of python expense_reader.py" in text.stdout
    bad = write(tmp_path, "applications:\n  - queue: Q\n    command: [x]\n    max_concurrency: many\n")
    res = runner.invoke(main, ["activator", "check", "--config", str(bad)])
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        (
            f"kbroker: error: {bad}: application Q: max_concurrency: Input should be a valid integer, "
            "unable to parse string as an integer (got 'many')"
        )
    ]


def test_text_log_lines_carry_the_same_fields():
    from kbroker.cli.activator import _text_line

    line = _text_line(
        {
            "time": "2026-01-01T00:00:00.000+00:00",
            "event": "exit",
            "namespace": "ns",
            "queue": "Q",
            "pid": 7,
            "returncode": -9,
            "signal": "SIGKILL",
        }
    )
    assert line == "2026-01-01T00:00:00.000+00:00 exit queue=Q pid=7 returncode=-9 signal=SIGKILL"
