"""What the activation scenarios share: a real `kbroker worker` (a subprocess, started once per
scenario) activating the procedures of kbroker/bench/procedures.py on ExpenseQueue, and its
monitor rows.

activation-latency  from a message arriving on an idle queue (monitor INACTIVE, no reader running)
                    to the first RECEIVE of the reader it activated returning it; p50 and p99.
                    Baseline: a plain confluent-kafka consumer already polling its queue.
activation-drain    time to drain a standing backlog once activation is turned on (ALTER QUEUE
                    ... ACTIVATION ON, max_queue_readers = K, the worker's ramp-up), vs a fixed
                    pool of K threads running the same procedure, all started at once.

The scenarios are in activation_latency.py and activation_drain.py. Each side has a namespace of
its own (topics/samples applied), so no consumer group is shared: the worker's readers only ever
see the kbroker side's queue.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from kbroker.bench import procedures
from kbroker.bench.harness import BenchContext, free_port
from kbroker.errors import BrokerUnavailableError
from kbroker.worker.web.web_client import get_json

# --- the worker -------------------------------------------------------------------------------


class WorkerProcess:
    """`python -m kbroker worker` on one namespace, with its log in a temporary file."""

    def __init__(
        self,
        ctx: BenchContext,
        namespace: str,
        *,
        ramp_up: float,
        handlers: int,
        activation_log: Path | None = None,
        extra: tuple[str, ...] = (),
    ):
        self.ctx, self.namespace, self.ramp_up = ctx, namespace, ramp_up
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="kbroker-bench-worker-"))
        self.log = self.dir / "worker.log"
        root = str(Path(__file__).resolve().parents[2])  # this checkout's kbroker, not another one
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        if activation_log is not None:
            env[procedures.LOG_ENV] = str(activation_log)
        self.cmd = [
            sys.executable,
            "-m",
            "kbroker",
            "worker",
            "--bootstrap",
            ctx.cluster.bootstrap,
            "--namespace",
            namespace,
            "--web-port",
            str(self.port),
            "--ramp-up",
            str(ramp_up),
            "--handlers",
            str(handlers),
            "--loglevel",
            "warning",
            "--allow-procedures",
            "kbroker.bench.procedures",
            *extra,
        ]  # not allowed by default
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)

    def tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.proc.returncode}: {self.tail()}")

    def wait_ready(self, queue: str, timeout: float = 120.0) -> None:
        """Its HTTP API answers and the queue's monitor has a row (the worker watches the queue)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            try:
                get_json(f"http://127.0.0.1:{self.port}", "/tasks/", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"the worker did not answer within {timeout:.0f} s: {self.tail()}")
        wait_monitor(self, queue, lambda row: True, max(1.0, deadline - time.monotonic()), "its first monitor row")

    def running_tasks(self) -> int:
        """Activated readers running now (the worker's /tasks/); 0 when it does not answer."""
        try:
            return len(get_json(f"http://127.0.0.1:{self.port}", "/tasks/", timeout=2)["tasks"])
        except (OSError, ValueError, KeyError):
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def monitor_rows_of(worker: WorkerProcess, timeout: float = 10.0) -> dict[str, dict]:
    """The worker's monitor rows (its view) by queue; {} while a changelog partition has no
    leader yet (ask again)."""
    from kbroker.worker.web.views import monitor_rows

    try:
        return {r["queue"]: r for r in monitor_rows(worker.ctx.cluster, worker.namespace, timeout=timeout)}
    except BrokerUnavailableError:
        return {}


def wait_monitor(worker: WorkerProcess, queue: str, pred: Callable[[dict], bool], timeout: float, what: str) -> dict:
    """Wait until the queue's monitor row satisfies `pred`; returns it (`what` names it in errors)."""
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        worker.check()
        row = monitor_rows_of(worker, timeout=5).get(queue)
        if row is not None and pred(row):
            return row
        time.sleep(0.1)
    raise RuntimeError(f"the worker's monitor of {queue}: no {what} within {timeout:.0f} s (last row: {row})")


def idle(row: dict) -> bool:
    """An idle monitor: INACTIVE, no reader running."""
    return row["readers"] == 0 and row["state"] == "INACTIVE"


def handlers_for(readers: int) -> int:
    """The worker's --handlers for `readers` activated readers, with room to spare."""
    return max(readers + 2, 2 * (os.cpu_count() or 1))
