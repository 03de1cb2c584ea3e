"""The external activator end to end against the real broker: QUEUE_ACTIVATION events start
programs that RECEIVE from the queue, no more than max_concurrency at once, min_concurrency always,
and nothing left running after shutdown. Its pure rules and config are tested in
tests/unit/test_activator_rules.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kbroker.activator.config import load_config
from kbroker.activator.runner import Activator
from kbroker.cli.demo import CLAIM, CONTRACT, EMPLOYEES, EXPENSES
from kbroker.core import names
from tests.helpers import ROOT, free_port, run_kbroker_module, wait_for

READER = ROOT / "examples" / "activator" / "expense_reader.py"


# --- end to end against the broker --------------------------------------------------------------


def activation(queue: str, ns: str, backlog: int = 1) -> bytes:
    return orjson.dumps(
        {
            "event": "QUEUE_ACTIVATION",
            "queue": queue,
            "namespace": ns,
            "backlog": backlog,
            "ready_groups": 1,
            "time": int(time.time() * 1000),
        }
    )


def publish(bootstrap: str, ns: str, events: list[tuple[str, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    for key, value in events:
        p.produce(names.events_topic(ns), key=key.encode(), value=value)
    assert p.flush(15) == 0


def config_file(tmp_path: Path, apps: str, extra: str = "") -> Path:
    path = tmp_path / "activator.yaml"
    path.write_text(f"{extra}applications:\n{apps}")
    return path


@contextmanager
def activator(tmp_path, bootstrap, ns, cfg_path):
    records: list[dict] = []
    out = open(tmp_path / "children.out", "a")  # noqa: SIM115 - closed in the finally below, after the children
    act = Activator(
        load_config(cfg_path), bootstrap, ns, log=records.append, poll_interval=0.1, child_stdout=out.fileno()
    )
    thread = threading.Thread(target=act.run, daemon=True)
    thread.start()
    try:
        assert act.ready.wait(30), f"activator never got its partitions: {records}"
        yield act, records
    finally:
        act.stop()
        thread.join(30)
        out.close()
        print("activator log:", *records, sep="\n  ")  # shown when the test fails
        assert not thread.is_alive()


def of(records, event):
    return [r for r in records if r["event"] == event]


def test_notification_starts_a_reader_that_drains_the_queue(kafka_bootstrap, namespace, broker, tmp_path):
    sent = set()
    for d in range(3):
        h = broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT)
        for i in range(4):
            sent.add(broker.send(h, CLAIM, {"dialog": d, "claim": i, "amount": 10 * i}))
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    name: reader
    command: [{sys.executable}, {READER}]
    max_concurrency: 2
    env: {{PYTHONPATH: "{ROOT}", READER_WAIT: "2"}}
""",
    )
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        # Other events and other queues share the topic: they start nothing.
        publish(
            kafka_bootstrap,
            namespace,
            [
                ("ExpenseQueue", orjson.dumps({"event": "QUEUE_DISABLED", "queue": "ExpenseQueue", "time": 0})),
                ("EmployeeQueue", activation("EmployeeQueue", namespace)),
                ("ExpenseQueue", activation("ExpenseQueue", namespace, backlog=12)),
            ],
        )
        wait_for(lambda: of(records, "exit"), 90, f"the reader to exit: {records}")
    starts, exits = of(records, "start"), of(records, "exit")
    assert len(starts) == 1 and starts[0]["reason"] == "notification" and starts[0]["application"] == "reader"
    assert [n["queue"] for n in of(records, "notification")] == ["ExpenseQueue"]
    assert exits[0]["pid"] == starts[0]["pid"] and exits[0]["returncode"] == 0
    lines = [json.loads(x) for x in (tmp_path / "children.out").read_text().splitlines()]
    assert {x["message_id"] for x in lines} == sent and len(lines) == 12
    assert {x["pid"] for x in lines} == {starts[0]["pid"]}
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []  # the reader committed what it read
    # The sample's ExpenseQueue has internal activation (OFF): the worker would never notify it.
    assert any("no external activation" in w["message"] for w in of(records, "warning"))


SLEEPER = """
import os, sys, time
log, seconds = sys.argv[1], float(sys.argv[2])
with open(log, "a") as f:
    f.write(f"{os.getpid()} start {time.time()} {os.environ['KBROKER_QUEUE']} {os.environ['KBROKER_NAMESPACE']}\\n")
time.sleep(seconds)
with open(log, "a") as f:
    f.write(f"{os.getpid()} end {time.time()}\\n")
"""


def max_overlap(log: Path) -> tuple[int, int]:
    """(most copies running at once, copies started) from the sleepers' log."""
    events = []
    for line in log.read_text().splitlines():
        pid, what, t = line.split()[:3]
        events.append((float(t), 1 if what == "start" else -1))
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        running += step
        peak = max(peak, running)
    return peak, sum(1 for _, s in events if s == 1)


def test_records_another_client_wrote_to_the_events_topic_start_nothing_and_stop_nothing(
    kafka_bootstrap, namespace, broker, tmp_path
):
    """Any client may write the events topic: garbage, a null key and value, a 512 KiB value (an
    event is a few hundred bytes), forged headers, JSON of the wrong shape, an activation naming no
    queue. The activator skips each and acts on the activation after. (A well-formed activation is
    acted on whoever wrote it: the topic's ACLs decide who may.)"""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    log = tmp_path / "sleepers.log"
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    command: [{sys.executable}, sleeper.py, {log}, "0"]
    cwd: .
    max_concurrency: 1
""",
    )
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        p = Producer({"bootstrap.servers": kafka_bootstrap, "allow.auto.create.topics": False})
        topic = names.events_topic(namespace)
        p.produce(topic, key=b"\xff\xfe", value=b"\x00not json\xff")
        p.produce(topic, key=None, value=None)
        p.produce(topic, key=b"ExpenseQueue", value=b"{" * (512 * 1024))
        p.produce(topic, key=b"ExpenseQueue", value=b"[1, 2, 3]")
        p.produce(
            topic,
            key=b"ExpenseQueue",
            value=orjson.dumps({"event": "QUEUE_ACTIVATED", "queue": 7}),
            headers=[("kb.follows", b"\xff"), ("event", b"QUEUE_ACTIVATION")],
        )
        p.produce(topic, key=None, value=orjson.dumps({"event": "QUEUE_ACTIVATION", "queue": ""}))
        assert p.flush(15) == 0
        publish(kafka_bootstrap, namespace, [("ExpenseQueue", activation("ExpenseQueue", namespace))])
        wait_for(lambda: of(records, "exit"), 30, "the copy the real activation started to exit")
    assert [n["decision"] for n in of(records, "notification")] == ["notification"]
    assert len(of(records, "start")) == 1 and not of(records, "kafka_error")


def test_a_burst_of_notifications_never_exceeds_max_concurrency(kafka_bootstrap, namespace, broker, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    log = tmp_path / "sleepers.log"
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    command: [{sys.executable}, sleeper.py, {log}, "2"]
    cwd: .
    max_concurrency: 2
""",
    )
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        publish(kafka_bootstrap, namespace, [("ExpenseQueue", activation("ExpenseQueue", namespace))] * 6)
        wait_for(lambda: len(of(records, "notification")) == 6, 30, "six notifications")
        wait_for(lambda: len(of(records, "exit")) == 2, 30, "both copies to exit")
        # Once they exited, a new burst starts copies again, still at most two.
        publish(kafka_bootstrap, namespace, [("ExpenseQueue", activation("ExpenseQueue", namespace))] * 3)
        wait_for(lambda: len(of(records, "exit")) == 4, 30, "the second pair to exit")
    assert [n["decision"] for n in of(records, "notification")] == ["notification"] * 2 + ["at_max"] * 4 + [
        "notification"
    ] * 2 + ["at_max"]
    assert max_overlap(log) == (2, 4)
    assert all(r["running"] <= 2 for r in of(records, "start"))
    assert all(
        line.split()[3:] == ["ExpenseQueue", namespace] for line in log.read_text().splitlines() if " start " in line
    )


def test_min_concurrency_keeps_copies_running(kafka_bootstrap, namespace, broker, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    log = tmp_path / "sleepers.log"
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    command: [{sys.executable}, sleeper.py, {log}, "0.3"]
    cwd: .
    min_concurrency: 1
    max_concurrency: 3
""",
        extra="restart_delay: 0.2\nshutdown_grace: 3\n",
    )
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        # No notification at all: the one copy is started, and replaced each time it exits.
        wait_for(lambda: len(of(records, "exit")) >= 3, 30, "three copies to come and go")
        # A copy that runs for good is stopped at shutdown.
        log2 = tmp_path / "long.log"
        act.apps["ExpenseQueue"].command[2:] = [str(log2), "60"]  # the next replacement sleeps long
        wait_for(lambda: log2.exists(), 30, "a long-running copy")
    starts, exits = of(records, "start"), of(records, "exit")
    assert {s["reason"] for s in starts} == {"min_concurrency"}
    assert max_overlap(log)[0] == 1  # min 1 with no notification: never a second copy
    assert [e["returncode"] for e in exits[:3]] == [0, 0, 0]
    assert exits[-1]["returncode"] == -signal.SIGTERM and exits[-1]["signal"] == "SIGTERM"
    assert len(starts) == len(exits)
    assert of(records, "activator_stopped")


def test_sigterm_stops_every_child_even_one_that_ignores_sigterm(kafka_bootstrap, namespace, broker, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n")
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    command: [{sys.executable}, {script}]
    min_concurrency: 2
    max_concurrency: 2
""",
        extra="shutdown_grace: 1\n",
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbroker",
            "activator",
            "run",
            "--config",
            str(cfg),
            "--bootstrap",
            kafka_bootstrap,
            "--namespace",
            namespace,
            "--json",
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[dict] = []
    try:
        deadline = time.monotonic() + 60
        while sum(1 for r in lines if r["event"] == "start") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, (lines, proc.poll())
            line = proc.stdout.readline()
            if line:
                lines.append(json.loads(line))
        pids = [r["pid"] for r in lines if r["event"] == "start"]
        for pid in pids:
            os.kill(pid, 0)  # alive
        # --metrics-port: the activator's own metrics, in Prometheus's text format.
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        starts = next(
            s.value
            for f in text_string_to_metric_families(scraped)
            for s in f.samples
            if s.name == "kbroker_activator_events_total"
            and s.labels == {"namespace": namespace, "queue": "ExpenseQueue", "event": "start"}
        )
        assert starts == 2
        time.sleep(0.5)  # let the children install their SIGTERM handler
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += [json.loads(x) for x in out.splitlines()]
    assert proc.returncode == 0, err
    exits = {r["pid"]: r for r in lines if r["event"] == "exit"}
    assert set(exits) == set(pids)
    assert {r["returncode"] for r in exits.values()} == {-signal.SIGKILL}  # SIGTERM ignored: killed
    assert lines[-1]["event"] == "activator_stopped"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_first_start_begins_at_latest_and_a_restart_resumes_where_it_stopped(
    kafka_bootstrap, namespace, broker, tmp_path
):
    log = tmp_path / "ran.log"
    cfg = config_file(
        tmp_path,
        f"""  - queue: ExpenseQueue
    command: [{sys.executable}, -c, "import os; open({str(log)!r}, 'a').write(str(os.getpid()) + chr(10))"]
""",
    )
    publish(kafka_bootstrap, namespace, [("ExpenseQueue", activation("ExpenseQueue", namespace))])
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        time.sleep(2)  # an event from before the first start is history, not work
        assert of(records, "notification") == []
    # Written while no activator runs: the next one starts at the committed offset and sees it.
    publish(kafka_bootstrap, namespace, [("ExpenseQueue", activation("ExpenseQueue", namespace))])
    with activator(tmp_path, kafka_bootstrap, namespace, cfg) as (act, records):
        wait_for(lambda: of(records, "exit"), 30, "the program to run")
    assert [n["decision"] for n in of(records, "notification")] == ["notification"]
    assert len(log.read_text().splitlines()) == 1


def test_run_without_the_namespace_topics_is_a_one_line_error(kafka_bootstrap, namespace, tmp_path):
    cfg = config_file(tmp_path, "  - queue: ExpenseQueue\n    command: [x]\n")
    res = run_kbroker_module(
        "activator", "run", "--config", str(cfg), "--bootstrap", kafka_bootstrap, "--namespace", namespace
    )
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"kbroker: error: topic kbroker.{namespace}.events does not exist: run 'kbroker apply' for "
        f"namespace {namespace!r} first"
    ]
