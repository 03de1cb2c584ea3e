"""Helpers shared by the tests: paths of this checkout, free ports, and the small loops and
subprocess runners several test modules use. Fixtures live in the conftest files; everything a
test imports by name lives here (or in tests.helpers.invariants / tests.helpers.procedures,
which worker subprocesses import by module path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kbroker.embedded import ports

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout under test
SAMPLES = ROOT / "topics" / "samples"
DATA = ROOT / "tests" / "data"
KBROKER = os.path.join(os.path.dirname(sys.executable), "kbroker")  # the CLI of this venv


def wait_for(
    pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.3, seen: Callable[[], Any] | None = None
) -> Any:
    """pred()'s first truthy answer, asked every `interval` seconds; AssertionError naming `what`
    after `timeout` seconds (and what `seen()` then reports: the state the wait last saw)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            last = f"; last seen: {seen()!r}" if seen is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{last}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen | None, timeout: float = 30) -> None:
    """SIGTERM a process still running (a worker, say), then kill it if it outlives `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the kernel's range for
    outgoing connections (a broker restarted on it must find it free: embedded.ports.free_port)."""
    return ports.free_port()


@contextmanager
def embedded_kafka(data_dir: Path, settings: dict[str, str] | None = None) -> Iterator[str]:
    """An embedded Kafka broker in `data_dir` on free ports, with `settings` added to its
    properties, for the duration of the block (its bootstrap address). The test fails, with
    the reason, when it does not start: no test skips for want of a broker."""
    from kbroker.embedded.broker import EmbeddedBroker

    broker = EmbeddedBroker(data_dir)
    try:
        status = broker.start(port=free_port(), controller_port=free_port(), settings=settings)
    except Exception as exc:  # noqa: BLE001 - fail with whatever went wrong
        pytest.fail(f"no Kafka broker for the tests: {exc}")
    assert status.bootstrap is not None  # a broker that started has an address
    try:
        yield status.bootstrap
    finally:
        broker.stop()


def docker_engine_answers() -> bool:
    """Whether a Docker engine answers a ping within 3 s (then testcontainers can run Kafka)."""
    try:
        import docker  # type: ignore[import-untyped]  # installed with testcontainers

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:  # noqa: BLE001 - no Docker, for whatever reason
        return False


def receive_at_least(broker: Any, queue: str, n: int, wait: float = 15.0) -> list:
    """RECEIVE (top=100, a transaction each) until `n` messages came back; fails if a RECEIVE
    waits `wait` seconds for nothing first."""
    got: list = []
    while len(got) < n:
        msgs = broker.receive(queue, top=100, wait=wait)
        assert msgs, f"only {len(got)} of {n} messages arrived"
        got += msgs
    return got


def run_kbroker_module(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    """Run `python -m kbroker ARGS` with this checkout first on PYTHONPATH; output as text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "kbroker", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
        **kw,
    )  # callers read returncode


def run_bench_cli(argv: list[str], env: dict, timeout: float) -> tuple[str, str]:
    """Run a `kbroker bench` command line in its own session (so a run that hangs is stopped with
    the child processes it started); fails the test unless it exits 0 within `timeout`."""
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"kbroker bench did not finish in {timeout:g} s: {stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return stdout, stderr
