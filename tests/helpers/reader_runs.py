"""Reader processes of tests/helpers/invariants.py run through a fault: start them, watch their
commit logs, tell when they got going and when they recovered, and check the invariants at the
end. For the fault tests (one fault each, the same measurements)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kbroker.core import names
from tests.helpers import ROOT
from tests.helpers import invariants as inv


@dataclass
class ReaderProcess:
    """One `python -m tests.helpers.invariants reader` process: its stop file and commit log."""

    proc: subprocess.Popen
    stop_file: Path
    log: Path

    @classmethod
    def start(
        cls, bootstrap: str, namespace: str, tmp: Path, name: str, readers: int, rollback_rate: float, seed: int
    ) -> ReaderProcess:
        stop_file, log = tmp / f"stop-{name}", tmp / f"log-{name}.jsonl"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.invariants",
                "reader",
                bootstrap,
                namespace,
                str(readers),
                str(stop_file),
                str(log),
                str(rollback_rate),
                str(seed),
            ],
            cwd=ROOT,
        )
        return cls(proc, stop_file, log)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """Ask it to stop (after its current transaction); kill it after `timeout`."""
        self.stop_file.touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class FaultRun:
    """A fault run's namespace, the requests sent and the reader processes receiving them."""

    namespace: str
    sent: set[str]
    readers: list[ReaderProcess]
    per_conversation: int = 3


def start_fault_run(bootstrap: str, tmp: Path, prefix: str, seeds: tuple[int, int]) -> FaultRun:
    """The invariant catalog applied on a new namespace, 300 conversations of 3 requests sent,
    and two reader processes of 3 readers each (5 % rollbacks) started on them."""
    from kbroker.kafka.catalog.apply import apply_paths
    from kbroker.sdk.broker import Broker

    namespace = prefix + uuid.uuid4().hex[:12]
    apply_paths(bootstrap, namespace, [inv.YAML])
    with Broker(bootstrap, namespace) as client:
        sent = inv.send_requests(client, 300, 3)
    readers = [
        ReaderProcess.start(bootstrap, namespace, tmp, name, 3, 0.05, seed) for name, seed in zip(("a", "b"), seeds)
    ]
    return FaultRun(namespace, sent, readers)


def commits(readers: list[ReaderProcess]) -> list[dict]:
    """Every transaction the readers logged as committed (with its `committed` time)."""
    return inv.read_logs([r.log for r in readers])


def wait_for_commits(readers: list[ReaderProcess], count: int, timeout: float) -> None:
    """Until the readers logged `count` commits: they are demonstrably mid-run."""
    deadline = time.monotonic() + timeout
    while len(commits(readers)) < count:
        assert time.monotonic() < deadline, f"the readers committed {len(commits(readers))} of {count} in time"
        assert all(r.running() for r in readers), "a reader process exited"
        time.sleep(0.1)


def first_commit_after(readers: list[ReaderProcess], since: float, timeout: float) -> float:
    """Wall-clock time of the first commit logged after `since` (time.time()); fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        after = [e["committed"] for e in commits(readers) if e["committed"] > since]
        if after:
            return float(min(after))
        assert time.monotonic() < deadline, f"no commit within {timeout:g} s after the fault"
        assert all(r.running() for r in readers), "a reader process exited"
        time.sleep(0.2)


def wait_for_all_replies(
    bootstrap: str, namespace: str, sent: set[str], readers: list[ReaderProcess], timeout: float
) -> list[dict]:
    """The committed replies, once they cover every sent request (or `timeout` passed)."""
    topic = names.queue_topic(namespace, "ReplyQueue")
    deadline = time.monotonic() + timeout
    while True:
        replies = inv.read_replies(bootstrap, topic)
        if sum(len(r["ids"]) for r in replies) >= len(sent) or time.monotonic() > deadline:
            return replies
        assert all(r.running() for r in readers), "a reader process exited"
        time.sleep(1)


def assert_no_violations(report: inv.Report) -> None:
    """All counts 0: nothing lost, duplicated, out of order, held by two at once, or unknown."""
    summary = (
        f"sent={report.sent} committed_tx={report.committed} lost={len(report.lost)} "
        f"duplicated={len(report.duplicated)} order={len(report.order_violations)} "
        f"lock={len(report.lock_violations)} unknown={len(report.unknown)}"
    )
    print(summary)
    assert report.ok(), (
        f"{summary}\n{report.lost[:3]} {report.duplicated[:3]} "
        f"{report.order_violations[:3]} {report.lock_violations[:3]}"
    )
