"""The embedded Apache Kafka broker: one real KRaft node (broker and controller in one JVM).

Maven resolves its jars once into the per-user cache. A data dir holds server.properties, the
KRaft log dirs, broker.log and broker.json (pid and ports). The JVM is detached, so the broker
outlives the `kbroker broker start` that launched it. Nothing happens at import time.
kbroker/embedded/cluster.py runs several such nodes as one replicated cluster.

A secure node (`start(secure=True)`, `kbroker broker start --secure`) speaks TLS only, and lets in
SCRAM-SHA-512 or PLAIN logins and client certificates of the users it knows, each allowed what
its ACLs say (`admin` everything); its certificates, passwords and client properties files are in
the data dir's `secure` dir (embedded/secure.py). A data dir is formatted plain or secure once
and for all."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import psutil

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.embedded import jvm, ports
from kbroker.embedded.certs import write_private
from kbroker.embedded.jvm import KAFKA_VERSION, MIN_JAVA, find_java
from kbroker.embedded.secure import ADMIN, SecureFiles
from kbroker.errors import BrokerUnavailableError, EmbeddedBrokerError, PortInUseError

__all__ = ["KAFKA_VERSION", "MIN_JAVA", "BrokerStatus", "EmbeddedBroker", "find_java"]

# Rewritten at every start, so a restart may use other ports: the controller quorum is static
# (controller.quorum.voters), and a voter's address is configuration, not stored state. A secure
# node has other listener lines (embedded/secure.py) between the same head and tail.
_HEAD = """\
# Written by kbroker at every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
"""
PLAIN_LISTENERS = """\
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
"""
_TAIL = """\
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
# A queue group's session time-out is 2 s (kafka/receive/group_protocol.py: Kafka's minimum is 6 s for the
# classic protocol, 45 s for the consumer protocol, which kbroker uses only when asked to), and
# a killed process's open transaction is aborted within 1 s of its time-out (Kafka checks every 10 s).
group.consumer.min.session.timeout.ms=1000
group.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=250
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
# kbroker creates its topics explicitly.
auto.create.topics.enable=false
num.partitions=1
# One node has no other to hand its partitions to: a controlled shutdown only leaves them without
# a leader before it stops, and Kafka's transaction coordinator skips the markers of a
# transaction completing then (it takes a leaderless partition for a deleted one) yet records the
# transaction complete, so it stays open on those partitions for good and read_committed readers
# stop there. Without it, a transaction ending at shutdown is finished after the restart.
controlled.shutdown.enable=false
"""
_SERVER_PROPERTIES = _HEAD + PLAIN_LISTENERS + _TAIL


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int | None
    controller_port: int | None
    bootstrap: str | None
    data_dir: Path
    version: str
    secure: bool = False
    tls_port: int | None = None  # a secure node's listener for client certificates
    client_properties: Path | None = None  # a running secure node's admin.properties

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "data_dir": str(self.data_dir),
            "client_properties": str(self.client_properties) if self.client_properties else None,
        }


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
        self.secure_files = SecureFiles(self.data_dir)

    def fetch(self) -> Path:
        """The libs dir of the Kafka jars (resolved with Maven on first use)."""
        return jvm.fetch_jars(self._say)

    def start(
        self,
        port: int = 9092,
        controller_port: int | None = None,
        wait: float = 90.0,
        settings: dict[str, str] | None = None,
        *,
        secure: bool | None = None,
        tls_port: int | None = None,
    ) -> BrokerStatus:
        """Start the node (a no-op when it runs) and wait until it answers. `settings` are
        broker properties added to kbroker's (a test's short log retention, say). `secure`: a
        secure node (True) or a plain one (False); None, what the data dir was formatted as
        (plain when new). `tls_port`, a secure node's listener for client certificates:
        port+2 when free, else any free port, unless given."""
        secure = self.secure_files.decide(secure, self._formatted())
        current = self.status()
        if current.running:
            return current
        java = find_java()
        tls_port = tls_port if secure else None  # a plain node has no such listener
        for p in (port, controller_port, tls_port):
            if p is not None and ports.bind(p) is None:
                raise PortInUseError(f"port {p} on 127.0.0.1 is already in use; choose another with --port")
        if controller_port is None:
            controller_port = ports.claim_port(port + 1, {port})
        if controller_port == port:
            raise PortInUseError(f"the controller port must differ from the broker port {port}")
        if secure and tls_port is None:
            tls_port = ports.claim_port(port + 2, {port, controller_port})
        if tls_port in (port, controller_port):
            raise PortInUseError(f"the TLS port {tls_port} must differ from the broker and controller ports")
        libs = self.fetch()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        files = self.secure_files
        admin_password = files.prepare() if secure else ""
        listeners = (
            files.listeners(port, tls_port, controller_port)
            if secure and tls_port
            else PLAIN_LISTENERS.format(port=port, cport=controller_port)
        )
        # Private: a secure node's configuration holds its PLAIN users' passwords.
        write_private(
            self.properties,
            (_HEAD + "{listeners}" + _TAIL).format(cport=controller_port, log_dirs=self.log_dirs, listeners=listeners)
            + "".join(f"{key}={value}\n" for key, value in (settings or {}).items()),
        )
        # Format once: meta.properties marks a formatted log dir. A secure node's admin gets its
        # SCRAM credential now, in the metadata log's first records (there is no admin to add
        # it later).
        if not self._formatted():
            self._say("formatting storage")
            scram = ("--add-scram", f"SCRAM-SHA-512=[name={ADMIN},password={admin_password}]")
            jvm.format_storage(
                java, libs, [(self.properties, self.log_dirs)], jvm.kafka_uuid(), scram if secure else ()
            )
            if secure:
                files.mark_enabled()
        if secure and tls_port:
            files.write_client_properties(f"127.0.0.1:{port}", f"127.0.0.1:{tls_port}")
        self._say("starting")
        proc = jvm.launch(java, libs, self.properties, self.log_file, ("-Xms256m", "-Xmx1g"))
        state = {
            "pid": proc.pid,
            "port": port,
            "controller_port": controller_port,
            "tls_port": tls_port,
            "version": KAFKA_VERSION,
            "started_at": datetime.now(timezone.utc).isoformat(),
        }
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        bootstrap = f"127.0.0.1:{port}"
        try:
            wait_ready([(proc, files.admin_cluster(bootstrap) if secure else bootstrap, self.log_file)], 1, wait)
        except BaseException:
            self.stop(timeout=10)
            raise
        self._say(f"ready at {bootstrap}")
        return self.status()

    def _formatted(self) -> bool:
        return (self.log_dirs / "meta.properties").exists()

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
        """Whether the node runs, with its pid and ports (and a secure one's client properties)."""
        proc = self._process()
        secure = self.secure_files.enabled
        if proc is None:
            return BrokerStatus(False, None, None, None, None, self.data_dir, KAFKA_VERSION, secure)
        state = self._state()
        return BrokerStatus(
            True,
            proc.pid,
            state["port"],
            state["controller_port"],
            f"127.0.0.1:{state['port']}",
            self.data_dir,
            state.get("version", KAFKA_VERSION),
            secure,
            state.get("tls_port"),
            self.secure_files.admin_properties if secure else None,
        )

    # --- users of a secure node --------------------------------------------------------------------

    def add_user(self, name: str) -> dict[str, Path]:
        """Add user `name` to the running secure node (SecureFiles.add_user); its files by kind.
        The user may do nothing until ACLs allow it."""
        status = self.status()
        self.secure_files.require_running(status.running)
        assert status.bootstrap and status.tls_port  # a running secure node has both
        return self.secure_files.add_user(name, status.bootstrap, f"127.0.0.1:{status.tls_port}")

    def remove_user(self, name: str) -> bool:
        """Remove user `name` from the running secure node (SecureFiles.remove_user); whether it
        existed. Its client certificate stays valid until it expires (Kafka checks no revocation
        list), for a principal without ACLs."""
        status = self.status()
        self.secure_files.require_running(status.running)
        assert status.bootstrap  # running
        return self.secure_files.remove_user(name, status.bootstrap)

    def _state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _process(self) -> psutil.Process | None:
        """The live broker JVM of this data dir, or None."""
        return jvm.kafka_process(self._state().get("pid"), self.properties)


def wait_ready(nodes: list[tuple[subprocess.Popen, ClusterLike, Path]], brokers: int, wait: float) -> None:
    """Until each node, a (JVM, the node's address as a Cluster with kbroker's credentials there,
    log file), answers a metadata request listing `brokers` brokers. AuthenticationFailedError
    when a node refuses the credentials or the TLS handshake; EmbeddedBrokerError (quoting the
    node's log) when one dies or `wait` seconds pass."""
    from kbroker.kafka import clients

    deadline = time.monotonic() + wait
    admins: dict[int, tuple[Any, clients.AuthFailures]] = {}
    waiting = dict(enumerate(nodes))
    while time.monotonic() < deadline:
        for i, (proc, cluster, log_file) in list(waiting.items()):
            if proc.poll() is not None:
                raise EmbeddedBrokerError(
                    f"the Kafka broker exited with code {proc.returncode} while starting "
                    f"(log: {log_file}): {jvm.tail(log_file)}"
                )
            # Wait for the listener before creating a client: librdkafka would print every
            # refused connection to stderr.
            if i not in admins and ports.accepts(_port_of(cluster)):
                failures = clients.AuthFailures()
                admins[i] = (clients.admin(cluster, error_cb=failures), failures)
            if i in admins:
                try:
                    timeout = max(1.0, min(5.0, deadline - time.monotonic()))
                    if clients.brokers_answering(cluster, timeout, *admins[i]) >= brokers:
                        del waiting[i]
                except BrokerUnavailableError:
                    pass
        if not waiting:
            return
        time.sleep(0.2)
    _, cluster, log_file = next(iter(waiting.values()))
    raise EmbeddedBrokerError(
        f"the Kafka broker did not answer at {cluster} within {wait:.0f}s (log: {log_file}): {jvm.tail(log_file)}"
    )


def _port_of(node: ClusterLike) -> int:
    """The port of a one-broker Cluster's address (host:port)."""
    return int(Cluster.of(node).bootstrap.rsplit(":", 1)[1])
