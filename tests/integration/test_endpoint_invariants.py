"""Many processes per side of the same dialogs, on the real broker (issue: one truth per
conversation endpoint). See tests/helpers/endpoint_runs.py for what each process does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kbroker.core import names
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.queue_views import set_queue_status
from kbroker.sdk.broker import Broker
from tests.helpers import ROOT, wait_for
from tests.helpers import endpoint_runs as run

_STARTED: list[subprocess.Popen] = []
SENT_BEFORE_ENDS = 160  # requests on the 40 dialogs before the first is ended
# Every process keeps 4 endpoints in memory and the rest in its cache's database
# (kafka/dialogs/spill.py), so the run's statements read their endpoints, leases and sequence
# reservations back from disk all the time: what a process past its memory tier does.
HOT = "4"


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "KBROKER_HOT_ENDPOINTS": HOT}
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.endpoint_runs", *args], cwd=ROOT, env=env)
    _STARTED.append(proc)
    return proc


@pytest.mark.long  # 50 s, four processes: `make test-long`
def test_two_processes_per_side_ending_sending_disabling_and_killed(kafka_bootstrap, namespace, tmp_path):
    """40 dialogs. Initiator side: one process sends on all of them round after round; once it
    sent 160 requests another starts sending once and ending each, spread over 15 s. Target
    side: two reader processes (four threads each, random rollbacks); the test turns the queue
    OFF and ON twice and kill -9s one reader mid-run. Lost, duplicated, out of order, delivered
    after EndDialog, EndDialogs missing, group lock overlaps: all 0, with every process's endpoint
    cache past its memory tier (HOT). Before the conversation
    lease, the two initiator processes numbered one dialog's messages from blocks of their own
    (order broken) and reused numbers."""
    apply_paths(kafka_bootstrap, namespace, [run.YAML])
    with Broker(kafka_bootstrap, namespace) as b:
        handles = [b.begin_dialog(run.CLIENT, run.SERVER, run.REQUESTS) for _ in range(40)]
    handles_file = tmp_path / "handles"
    handles_file.write_text("\n".join(handles))
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("sender", "ender", "a", "b")}
    stops = {name: tmp_path / f"stop-{name}" for name in ("sender", "a", "b")}
    a = start("reader", kafka_bootstrap, namespace, "4", str(stops["a"]), str(logs["a"]), "1")
    b = start("reader", kafka_bootstrap, namespace, "4", str(stops["b"]), str(logs["b"]), "2")
    sender = start(
        "sender", kafka_bootstrap, namespace, str(handles_file), str(stops["sender"]), str(logs["sender"]), "3"
    )
    # The ender starts once the sender is under way, so at least SENT_BEFORE_ENDS requests (and
    # those sent while the dialogs are ended) whatever the machine's pace: a busy CI machine's
    # sender managed 198 where an idle one sends about 700.
    wait_for(lambda: len(run.read_logs([logs["sender"]])) >= SENT_BEFORE_ENDS, 120, "the sender to get going")
    ender = start("ender", kafka_bootstrap, namespace, str(handles_file), str(logs["ender"]), "4", "15")
    wait_for(lambda: len(run.read_logs([logs["a"], logs["b"]])) >= 20, 90, "the readers to get going")
    for cycle in range(2):
        set_queue_status(kafka_bootstrap, namespace, "RequestQueue", "OFF", f"test cycle {cycle}")
        time.sleep(2.0)
        if cycle == 1:
            os.kill(b.pid, signal.SIGKILL)
            b.wait()
        set_queue_status(kafka_bootstrap, namespace, "RequestQueue", "ON", f"test cycle {cycle}")
        time.sleep(2.0)
    assert ender.wait(120) == 0, "the ender failed"
    stops["sender"].touch()
    assert sender.wait(60) == 0, "the sender failed"
    send_logs = run.read_logs([logs["sender"], logs["ender"]])
    expected = {e["id"] for e in send_logs}
    audit_topic = names.queue_topic(namespace, "AuditQueue")

    def all_audited() -> bool:
        got = {mid for au in run.read_audit(kafka_bootstrap, audit_topic) for mid in au["ids"]}
        ends = sum(au["types"].count(run.END_DIALOG) for au in run.read_audit(kafka_bootstrap, audit_topic))
        return expected <= got and ends >= 40

    deadline = time.monotonic() + 120
    while not all_audited() and time.monotonic() < deadline:  # then the report says what is missing
        time.sleep(1.0)
    stops["a"].touch()
    assert a.wait(60) == 0, "reader A failed"
    report = run.check(send_logs, run.read_audit(kafka_bootstrap, audit_topic), run.read_logs([logs["a"], logs["b"]]))
    print(f"\nendpoint run: {report.counts()}")
    assert report.sent >= SENT_BEFORE_ENDS + 40 and report.ended == 40, report.counts()
    assert report.ok(), (
        report.counts(),
        report.lost[:3],
        report.duplicated[:3],
        report.unknown[:3],
        report.order_violations[:3],
        report.after_end[:3],
        report.ends_missing,
        report.lock_violations[:3],
    )
    for name in ("sender", "ender", "a"):  # the processes that ended cleanly: each used its disk tier
        spill = json.loads((tmp_path / f"{name}.jsonl.spill").read_text())
        assert spill["on_disk"] > 0 and spill["read_back"] > 0, (name, spill)
    dead = [m for m in (run.read_audit(kafka_bootstrap, names.deadletter_topic(namespace)) or [])]
    assert dead == [], f"{len(dead)} messages dead-lettered (a SEND after its dialog ended)"


def test_the_checker_counts_what_it_is_shown():
    """The checker itself, on a hand-made run: each kind of violation is counted."""
    sent = [{"id": "m1", "handle": "h"}, {"id": "m2", "handle": "h"}, {"id": "m3", "handle": "h", "ended": True}]
    audits = [
        {"conversation_id": "c", "leased": 1.0, "ids": ["m2"], "seqs": [1], "types": [run.REQUEST]},
        {"conversation_id": "c", "leased": 2.0, "ids": ["e"], "seqs": [2], "types": [run.END_DIALOG]},
        {"conversation_id": "c", "leased": 3.0, "ids": ["m2", "x"], "seqs": [0, 3], "types": [run.REQUEST] * 2},
    ]
    readers = [
        {"group": "g", "leased": 1.0, "committing": 2.1, "committed": 2.5, "pid": 1, "reader": 0},
        {"group": "g", "leased": 2.0, "committed": 2.2, "pid": 2, "reader": 0},
    ]
    r = run.check(sent, audits, readers)
    assert (r.lost, r.duplicated, r.unknown) == (["m1", "m3"], ["m2"], ["x"])
    assert len(r.order_violations) == 1 and len(r.after_end) == 1 and len(r.lock_violations) == 1
    assert not r.ok()
