"""One Kafka broker for the whole test session, chosen by the project's broker rule:
KBROKER_BOOTSTRAP if set, else a testcontainers Kafka when a Docker engine answers, else the
embedded Apache Kafka on free ports with a temporary data dir. When none can be had the fixture
fails with the reason: no test skips for want of a broker."""

from __future__ import annotations

import os
import signal
import socket
import sys
import uuid
from pathlib import Path

import pytest

from kbroker.embedded.broker import KAFKA_VERSION, EmbeddedBroker

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "topics" / "samples"
KBROKER = os.path.join(os.path.dirname(sys.executable), "kbroker")  # the CLI of this venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker_engine_answers() -> bool:
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def pytest_configure(config):
    # A run ended by SIGTERM (a CI time-out, `timeout`) still tears its fixtures down, so the
    # embedded broker it started does not outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    env = os.environ.get("KBROKER_BOOTSTRAP")
    if env:
        yield env
        return
    if docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        try:
            container = KafkaContainer(f"apache/kafka:{KAFKA_VERSION}").with_kraft()
            container.start()
        except Exception as exc:  # pragma: no cover - only where Docker runs
            pytest.fail(f"Docker answers but the Kafka container did not start: {exc}")
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()
        return
    data_dir = tmp_path_factory.mktemp("kafka")
    broker = EmbeddedBroker(data_dir)
    try:
        status = broker.start(port=free_port(), controller_port=free_port())
    except Exception as exc:
        pytest.fail(f"no Kafka broker for the tests: {exc}")
    try:
        yield status.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test, so tests never see each other's topics."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def broker(kafka_bootstrap, namespace):
    """A Broker on a fresh namespace with the sample catalog (topics/samples) applied."""
    from kbroker.kafka.apply import apply_paths
    from kbroker.sdk.broker import Broker

    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


def receive_at_least(broker, queue: str, n: int, wait: float = 15.0) -> list:
    """RECEIVE (top=100, a transaction each) until `n` messages came back; fails if a RECEIVE
    waits `wait` seconds for nothing first."""
    got: list = []
    while len(got) < n:
        msgs = broker.receive(queue, top=100, wait=wait)
        assert msgs, f"only {len(got)} of {n} messages arrived"
        got += msgs
    return got


def run_bench_cli(argv: list[str], env: dict, timeout: float) -> tuple[str, str]:
    """Run a `kbroker bench` command line in its own session (so a run that hangs is stopped with
    the child processes it started); fails the test unless it exits 0 within `timeout`."""
    import subprocess

    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"kbroker bench did not finish in {timeout:g} s: {stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return stdout, stderr
