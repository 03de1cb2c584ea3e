"""The embedded Apache Kafka broker: one real KRaft node (broker and controller in one JVM).

Maven resolves its jars once into the per-user cache. A data dir holds server.properties, the
KRaft log dirs, broker.log and broker.json (pid and ports). The JVM is detached, so the broker
outlives the `kbroker broker start` that launched it. Nothing happens at import time.
kbroker/embedded/cluster.py runs several such nodes as one replicated cluster."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import psutil

from kbroker.embedded import jvm
from kbroker.embedded.jvm import KAFKA_VERSION, MIN_JAVA, find_java
from kbroker.errors import BrokerUnavailableError, EmbeddedBrokerError, PortInUseError

__all__ = ["KAFKA_VERSION", "MIN_JAVA", "BrokerStatus", "EmbeddedBroker", "find_java"]

# Rewritten at every start, so a restart may use other ports: the controller quorum is static
# (controller.quorum.voters), and a voter's address is configuration, not stored state.
_SERVER_PROPERTIES = """\
# Written by kbroker at every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dirs}
# One node: every internal topic has one replica and needs only that one in sync.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# kbroker creates its topics explicitly.
auto.create.topics.enable=false
num.partitions=1
"""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int | None
    controller_port: int | None
    bootstrap: str | None
    data_dir: Path
    version: str

    def as_dict(self) -> dict:
        return {**asdict(self), "data_dir": str(self.data_dir)}


class EmbeddedBroker:
    """One combined broker+controller KRaft node in `data_dir` (see the module docstring)."""

    def __init__(self, data_dir: Path | str, *, progress: Callable[[str], None] | None = None):
        # Absolute and resolved: the path is matched against the JVM's command line in status().
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._say = progress or (lambda _msg: None)
        self.properties = self.data_dir / "server.properties"
        self.state_file = self.data_dir / "broker.json"
        self.log_file = self.data_dir / "broker.log"
        self.log_dirs = self.data_dir / "logs"

    def fetch(self) -> Path:
        """The libs dir of the Kafka jars (resolved with Maven on first use)."""
        return jvm.fetch_jars(self._say)

    def start(self, port: int = 9092, controller_port: int | None = None,
              wait: float = 90.0, settings: dict[str, str] | None = None) -> BrokerStatus:
        """Start the node (a no-op when it runs) and wait until it answers. `settings` are
        broker properties added to kbroker's (a test's short log retention, say)."""
        current = self.status()
        if current.running:
            return current
        java = find_java()
        for p in (port, controller_port):
            if p is not None and jvm.bind(p) is None:
                raise PortInUseError(
                    f"port {p} on 127.0.0.1 is already in use; choose another with --port")
        if controller_port is None:
            controller_port = (jvm.bind(port + 1) if port < 65535 else None) or jvm.bind(0)
        if controller_port == port:
            raise PortInUseError(f"the controller port must differ from the broker port {port}")
        libs = self.fetch()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(
            _SERVER_PROPERTIES.format(port=port, cport=controller_port, log_dirs=self.log_dirs)
            + "".join(f"{key}={value}\n" for key, value in (settings or {}).items()))
        # Format once: meta.properties marks a formatted log dir.
        if not (self.log_dirs / "meta.properties").exists():
            self._say("formatting storage")
            jvm.format_storage(java, libs, [(self.properties, self.log_dirs)], jvm.kafka_uuid())
        self._say("starting")
        proc = jvm.launch(java, libs, self.properties, self.log_file, ("-Xms256m", "-Xmx1g"))
        state = {"pid": proc.pid, "port": port, "controller_port": controller_port,
                 "version": KAFKA_VERSION, "started_at": datetime.now(timezone.utc).isoformat()}
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        try:
            wait_ready([(proc, port, self.log_file)], 1, wait)
        except BaseException:
            self.stop(timeout=10)
            raise
        self._say(f"ready at 127.0.0.1:{port}")
        return self.status()

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop the node cleanly (SIGKILL after `timeout`); whether it was running."""
        proc = self._process()
        if proc is None:
            self.state_file.unlink(missing_ok=True)
            return False
        jvm.terminate(proc, timeout)
        jvm.reap()
        self.state_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        """Whether the node runs, with its pid and ports."""
        proc = self._process()
        if proc is None:
            return BrokerStatus(False, None, None, None, None, self.data_dir, KAFKA_VERSION)
        state = self._state()
        return BrokerStatus(True, proc.pid, state["port"], state["controller_port"],
                            f"127.0.0.1:{state['port']}", self.data_dir,
                            state.get("version", KAFKA_VERSION))

    def _state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _process(self) -> psutil.Process | None:
        """The live broker JVM of this data dir, or None."""
        return jvm.kafka_process(self._state().get("pid"), self.properties)


def wait_ready(nodes: list[tuple[subprocess.Popen, int, Path]], brokers: int, wait: float) -> None:
    """Until each node, a (JVM, broker port, log file), answers a metadata request listing
    `brokers` brokers; EmbeddedBrokerError (quoting the node's log) when one dies or `wait`
    seconds pass."""
    from kbroker.kafka import clients

    deadline = time.monotonic() + wait
    admins: dict[int, Any] = {}
    waiting = list(nodes)
    while time.monotonic() < deadline:
        for proc, port, log_file in list(waiting):
            if proc.poll() is not None:
                raise EmbeddedBrokerError(
                    f"the Kafka broker exited with code {proc.returncode} while starting "
                    f"(log: {log_file}): {jvm.tail(log_file)}")
            # Wait for the listener before creating a client: librdkafka would print every
            # refused connection to stderr.
            if port not in admins and jvm.accepts(port):
                admins[port] = clients.admin(f"127.0.0.1:{port}")
            if port in admins:
                try:
                    timeout = max(1.0, min(5.0, deadline - time.monotonic()))
                    if clients.brokers_answering(f"127.0.0.1:{port}", timeout, admins[port]) >= brokers:
                        waiting.remove((proc, port, log_file))
                except BrokerUnavailableError:
                    pass
        if not waiting:
            return
        time.sleep(0.2)
    _, port, log_file = waiting[0]
    raise EmbeddedBrokerError(
        f"the Kafka broker did not answer at 127.0.0.1:{port} within {wait:.0f}s "
        f"(log: {log_file}): {jvm.tail(log_file)}")
