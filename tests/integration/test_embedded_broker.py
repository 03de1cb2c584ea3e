"""The embedded Apache Kafka broker, for real: its own data dir and ports (not the session
broker), one start/stop/start cycle, and the one-line failures for a busy port, a missing Java
and a missing Maven."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.embedded.broker import KAFKA_VERSION, EmbeddedBroker
from kbroker.errors import PortInUseError
from tests.helpers import KBROKER, free_port


def kbroker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(KBROKER), *args], capture_output=True, text=True, env=env, timeout=240)


def bare_path(tmp_path: Path, *tools: str) -> dict:
    """An environment whose PATH holds python and the given tools only (no JAVA_HOME)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    for tool in tools:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "KBROKER_BOOTSTRAP")}
    return {**env, "PATH": str(bin_dir)}


def broker_jvms() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if "kafka.Kafka" in (p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.mark.long  # 30 s, two broker starts: `make test-long`
def test_data_survives_stop_and_start(tmp_path):
    data_dir = tmp_path / "kafka"
    said: list[str] = []
    broker = EmbeddedBroker(data_dir, progress=said.append)
    assert not broker.status().running
    assert broker.stop() is False

    port, cport = free_port(), free_port()
    try:
        st = broker.start(port=port, controller_port=cport)
        assert st.running and st.bootstrap == f"127.0.0.1:{port}"
        assert (st.port, st.controller_port, st.version) == (port, cport, KAFKA_VERSION)
        assert "formatting storage" in said and said[-1] == f"ready at 127.0.0.1:{port}"
        assert broker.start(port=port).pid == st.pid  # idempotent: the running broker
        assert json.loads((data_dir / "broker.json").read_text())["pid"] == st.pid

        topic = "kb-survive-" + uuid.uuid4().hex[:8]
        admin = AdminClient({"bootstrap.servers": st.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        delivered = []
        producer = Producer({"bootstrap.servers": st.bootstrap, "acks": "all"})
        producer.produce(
            topic, key=b"k", value=b"survives a restart", on_delivery=lambda err, msg: delivered.append(err)
        )
        assert producer.flush(30) == 0 and delivered == [None]
        del producer, admin

        assert broker.stop() is True
        assert not psutil.pid_exists(st.pid)
        assert not broker.status().running and broker.status().bootstrap is None
        assert (data_dir / "logs" / ".kafka_cleanshutdown").exists()  # a clean shutdown

        # Same data dir, other ports: storage is not formatted again and the message is back.
        said.clear()
        port2 = free_port()
        st2 = broker.start(port=port2)
        assert st2.running and st2.bootstrap == f"127.0.0.1:{port2}" and st2.pid != st.pid
        assert "formatting storage" not in said
        consumer = Consumer(
            {"bootstrap.servers": st2.bootstrap, "group.id": "kb-survive", "auto.offset.reset": "earliest"}
        )
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group join: faster
        msg = None
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                break
        consumer.close()
        assert msg is not None and msg.error() is None
        assert (msg.key(), msg.value()) == (b"k", b"survives a restart")

        # The CLI sees the same broker, and stops it.
        out = kbroker("broker", "status", "--data-dir", str(data_dir), "--json")
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        assert shown["running"] and shown["pid"] == st2.pid and shown["port"] == port2
        out = kbroker("broker", "stop", "--data-dir", str(data_dir))
        assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr
        assert not broker.status().running  # also reaps the JVM, a child of this process
        assert not psutil.pid_exists(st2.pid)
        out = kbroker("broker", "status", "--data-dir", str(data_dir))
        assert out.returncode == 0 and out.stdout.startswith("not running")
    finally:
        broker.stop()
    assert not [p for p in broker_jvms() if str(data_dir) in " ".join(p.info["cmdline"])]


def test_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=str(port)):
            EmbeddedBroker(tmp_path / "a").start(port=port)
        out = kbroker("broker", "start", "--data-dir", str(tmp_path / "b"), "--port", str(port))
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "--port" in lines[0], out.stderr
    assert not (tmp_path / "b" / "broker.json").exists()


def test_java_missing(tmp_path):
    env = bare_path(tmp_path)
    out = kbroker("broker", "start", "--data-dir", str(tmp_path / "d"), "--port", str(free_port()), env=env)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Java" in lines[0], out.stderr


def test_maven_missing(tmp_path):
    # An empty jar cache, so the jars must be fetched, and java but no mvn on PATH.
    env = {**bare_path(tmp_path, "java"), "KBROKER_CACHE_DIR": str(tmp_path / "cache")}
    out = kbroker("broker", "start", "--data-dir", str(tmp_path / "d"), "--port", str(free_port()), env=env)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Maven" in lines[0], out.stderr
    assert not (tmp_path / "d" / "broker.json").exists()
