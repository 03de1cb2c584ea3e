"""An embedded replicated Apache Kafka cluster: N real KRaft nodes on 127.0.0.1, each a combined
broker+controller JVM, the N controllers one static quorum (controller.quorum.voters).

For testing what must survive the loss of a node (restarts, leader and coordinator moves). The
data dir holds cluster.json (the nodes' pids and ports) and one dir per node, node-<id>, with its
server.properties, KRaft log dir and broker.log. Node ids are Kafka's node.id, 1..N, so the
leader id an admin client reports names the node to kill. Broker ports are port..port+N-1; the
controllers take the next N ports when free, else any free ones. Like the single broker, the JVMs
are detached and outlive the process that started them. The ports and each node's
server.properties are chosen in embedded/node_config.py.

A secure cluster (`start(secure=True)`) is secured as the single broker is, with one `secure` dir
for all nodes (they all listen on 127.0.0.1, so one broker certificate serves them all); its
nodes' TLS ports come after the controllers'."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import psutil

from kbroker.core.cluster import ClusterLike
from kbroker.embedded import jvm
from kbroker.embedded.broker import PLAIN_LISTENERS, EmbeddedBroker, wait_ready
from kbroker.embedded.certs import write_private
from kbroker.embedded.jvm import KAFKA_VERSION, find_java
from kbroker.embedded.node_config import NODE_HEAP, Ports, new_ports, node_properties
from kbroker.embedded.secure import ADMIN, SecureFiles
from kbroker.errors import EmbeddedBrokerError

MAX_NODES = 9


@dataclass(frozen=True)
class NodeStatus:
    """One node of the cluster: whether its JVM runs, its pid and ports."""

    node_id: int
    running: bool
    pid: int | None
    port: int | None
    controller_port: int | None
    data_dir: Path
    tls_port: int | None = None  # a secure node's listener for client certificates

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "data_dir": str(self.data_dir)}


@dataclass(frozen=True)
class ClusterStatus:
    """The cluster: running while any node runs; `bootstrap` lists every node's address."""

    running: bool
    nodes: tuple[NodeStatus, ...]
    bootstrap: str | None
    data_dir: Path
    version: str
    secure: bool = False
    client_properties: Path | None = None  # a running secure cluster's admin.properties

    @property
    def nodes_running(self) -> int:
        return sum(n.running for n in self.nodes)

    @property
    def tls_bootstrap(self) -> str | None:
        """Every running secure node's listener for client certificates."""
        return ",".join(f"127.0.0.1:{n.tls_port}" for n in self.nodes if n.tls_port) if self.running else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "bootstrap": self.bootstrap,
            "data_dir": str(self.data_dir),
            "version": self.version,
            "node_count": len(self.nodes),
            "nodes_running": self.nodes_running,
            "secure": self.secure,
            "tls_bootstrap": self.tls_bootstrap,
            "client_properties": str(self.client_properties) if self.client_properties else None,
            "nodes": [n.as_dict() for n in self.nodes],
        }


class EmbeddedCluster:
    """`nodes` KRaft nodes in `data_dir` (see the module docstring)."""

    def __init__(self, data_dir: Path | str, nodes: int = 3, *, progress: Callable[[str], None] | None = None):
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"a cluster has 1 to {MAX_NODES} nodes, not {nodes}")
        # Absolute and resolved: the path is matched against the JVMs' command lines.
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.node_ids = list(range(1, nodes + 1))
        self._say = progress or (lambda _msg: None)
        self.state_file = self.data_dir / "cluster.json"
        self.secure_files = SecureFiles(self.data_dir)

    @staticmethod
    def node_count(data_dir: Path | str) -> int:
        """How many nodes the cluster in `data_dir` has (0 when it holds none)."""
        root = Path(data_dir).expanduser()
        return sum(1 for i in range(1, MAX_NODES + 1) if (root / f"node-{i}").is_dir())

    def node_dir(self, node_id: int) -> Path:
        self._check_node(node_id)
        return self.data_dir / f"node-{node_id}"

    def _properties(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.properties"

    def _log_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "broker.log"

    def _check_node(self, node_id: int) -> None:
        if node_id not in self.node_ids:
            raise ValueError(f"no node {node_id}: the cluster's nodes are 1 to {len(self.node_ids)}")

    # --- starting ------------------------------------------------------------------------------

    def start(self, port: int = 9092, wait: float = 90.0, *, secure: bool | None = None) -> ClusterStatus:
        """Start every node not running (a no-op when all run) and wait until each answers with
        all N brokers registered. With no node running, brokers take ports port..port+N-1.
        `secure`: a secure cluster (True) or a plain one (False); None, what the data dir was
        formatted as (plain when new)."""
        if EmbeddedBroker(self.data_dir).status().running or (self.data_dir / "logs").is_dir():
            raise EmbeddedBrokerError(
                f"{self.data_dir} holds a single-node broker; use another --data-dir for a cluster"
            )
        held = self.node_count(self.data_dir)
        if held and held != len(self.node_ids):
            raise EmbeddedBrokerError(
                f"{self.data_dir} holds a {held}-node cluster, not {len(self.node_ids)}; "
                f"start it with --nodes {held} or use another --data-dir"
            )
        secure = self.secure_files.decide(secure, self._meta(1).exists())
        current = self.status()
        down = [n.node_id for n in current.nodes if not n.running]
        if down:
            ports = self._ports_of_running() if current.running else new_ports(port, self.node_ids, secure)
            self._launch(down, ports, current.nodes_running, wait)
        status = self.status()
        self._say(f"ready at {status.bootstrap}")
        return status

    def start_node(self, node_id: int, wait: float = 90.0) -> NodeStatus:
        """Start one node again (after kill_node or stop_node) on its recorded ports, and wait
        until it answers with every running node's broker registered."""
        self._check_node(node_id)
        current = self.status()
        if not current.running:
            raise EmbeddedBrokerError(f"the cluster in {self.data_dir} is not running; start it first")
        if not current.nodes[node_id - 1].running:
            self._launch([node_id], self._ports_of_running(), current.nodes_running, wait)
        return self.status().nodes[node_id - 1]

    def _launch(self, down: list[int], ports: dict[int, Ports], running: int, wait: float) -> None:
        """Start the nodes `down` (`running` others run already) and wait until they answer."""
        java = find_java()
        libs = jvm.fetch_jars(self._say)
        secure = ports[self.node_ids[0]][2] is not None
        admin_password = self.secure_files.prepare() if secure else ""
        self._write_config(ports)
        self._format(java, libs, admin_password)
        bootstrap = ",".join(f"127.0.0.1:{ports[i][0]}" for i in self.node_ids)
        if secure:
            self.secure_files.write_client_properties(
                bootstrap, ",".join(f"127.0.0.1:{ports[i][2]}" for i in self.node_ids)
            )
        self._say(f"starting {len(down)} nodes" if len(down) > 1 else f"starting node {down[0]}")
        started = {i: jvm.launch(java, libs, self._properties(i), self._log_file(i), NODE_HEAP) for i in down}
        state: dict[str, Any] = (
            self._state()
            if running
            else {"version": KAFKA_VERSION, "started_at": datetime.now(timezone.utc).isoformat(), "nodes": {}}
        )
        for i in self.node_ids:
            pid = started[i].pid if i in started else state["nodes"][str(i)]["pid"]
            state["nodes"][str(i)] = {
                "pid": pid,
                "port": ports[i][0],
                "controller_port": ports[i][1],
                "tls_port": ports[i][2],
            }
        self._write_state(state)

        def node(i: int) -> ClusterLike:  # as kbroker's clients reach it, the admin when secure
            address = f"127.0.0.1:{ports[i][0]}"
            return self.secure_files.admin_cluster(address) if secure else address

        try:
            wait_ready([(started[i], node(i), self._log_file(i)) for i in down], running + len(down), wait)
        except BaseException:
            for i in down:
                self.stop_node(i, timeout=10)
            if not running:
                self.state_file.unlink(missing_ok=True)
            raise

    def _ports_of_running(self) -> dict[int, Ports]:
        nodes = self._state()["nodes"]
        return {
            i: (nodes[str(i)]["port"], nodes[str(i)]["controller_port"], nodes[str(i)].get("tls_port"))
            for i in self.node_ids
        }

    def _write_config(self, ports: dict[int, Ports]) -> None:
        voters = ",".join(f"{i}@127.0.0.1:{ports[i][1]}" for i in self.node_ids)
        # The cluster's defaults (and its internal topics) follow the rule `kbroker apply` uses.
        from kbroker.kafka.catalog.apply import choose_replication

        replicas, min_isr = choose_replication(len(self.node_ids))
        for i in self.node_ids:
            port, cport, tls_port = ports[i]
            listeners = (
                self.secure_files.listeners(port, tls_port, cport)
                if tls_port
                else PLAIN_LISTENERS.format(port=port, cport=cport)
            )
            self.node_dir(i).mkdir(parents=True, exist_ok=True)
            # Private: a secure node's configuration holds its PLAIN users' passwords.
            write_private(
                self._properties(i), node_properties(i, voters, listeners, self.node_dir(i) / "logs", replicas, min_isr)
            )

    def _format(self, java: str, libs: Path, admin_password: str) -> None:
        """Format the log dirs not formatted yet, all with the cluster's one id (and, with an
        `admin_password`, the admin's SCRAM credential)."""
        unformatted = [i for i in self.node_ids if not self._meta(i).exists()]
        if not unformatted:
            return
        self._say("formatting storage")
        cluster_id = self._cluster_id() or jvm.kafka_uuid()
        scram = ("--add-scram", f"SCRAM-SHA-512=[name={ADMIN},password={admin_password}]")
        jvm.format_storage(
            java,
            libs,
            [(self._properties(i), self.node_dir(i) / "logs") for i in unformatted],
            cluster_id,
            scram if admin_password else (),
        )
        if admin_password:
            self.secure_files.mark_enabled()

    def _meta(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "logs" / "meta.properties"

    def _cluster_id(self) -> str | None:
        for i in self.node_ids:
            try:
                for line in self._meta(i).read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
            except OSError:
                continue
        return None

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop every node cleanly (SIGKILL after `timeout`); whether any was running."""
        procs = [p for p in (self._process(i) for i in self.node_ids) if p is not None]
        # All at once: a node stopped alone hands its leaderships over, which the last nodes
        # cannot do once the controller quorum has lost its majority.
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            if not jvm.wait_exit(proc, timeout):
                jvm.kill(proc)
        jvm.reap()
        self.state_file.unlink(missing_ok=True)
        return bool(procs)

    def stop_node(self, node_id: int, timeout: float = 60.0) -> bool:
        """Stop one node cleanly (a controlled shutdown); whether it was running."""
        proc = self._process(node_id)
        if proc is None:
            return False
        jvm.terminate(proc, timeout)
        jvm.reap()
        return True

    def kill_node(self, node_id: int) -> bool:
        """SIGKILL one node's JVM, as a crash would end it; whether it was running."""
        proc = self._process(node_id)
        if proc is None:
            return False
        jvm.kill(proc)
        jvm.reap()
        return True

    # --- state ---------------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        """Each node's state; the cluster runs while any node does."""
        nodes_state = self._state().get("nodes", {})
        nodes = []
        for i in self.node_ids:
            recorded = nodes_state.get(str(i), {})
            proc = self._process(i)
            nodes.append(
                NodeStatus(
                    i,
                    proc is not None,
                    proc.pid if proc else None,
                    recorded.get("port"),
                    recorded.get("controller_port"),
                    self.node_dir(i),
                    recorded.get("tls_port"),
                )
            )
        running = any(n.running for n in nodes)
        bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in nodes) if running else None
        secure = self.secure_files.enabled
        return ClusterStatus(
            running,
            tuple(nodes),
            bootstrap,
            self.data_dir,
            self._state().get("version", KAFKA_VERSION),
            secure,
            self.secure_files.admin_properties if secure and running else None,
        )

    # --- users of a secure cluster ---------------------------------------------------------------

    def add_user(self, name: str) -> dict[str, Path]:
        """Add user `name` to the running secure cluster (SecureFiles.add_user); its files by kind."""
        status = self.status()
        self.secure_files.require_running(status.running)
        assert status.bootstrap and status.tls_bootstrap  # a running secure cluster has both
        return self.secure_files.add_user(name, status.bootstrap, status.tls_bootstrap)

    def remove_user(self, name: str) -> bool:
        """Remove user `name` from the running secure cluster (SecureFiles.remove_user); whether
        it existed."""
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

    def _write_state(self, state: dict[str, Any]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    def _process(self, node_id: int) -> psutil.Process | None:
        pid = self._state().get("nodes", {}).get(str(node_id), {}).get("pid")
        return jvm.kafka_process(pid, self._properties(node_id))


def embedded_at(
    data_dir: Path | str, nodes: int | None = None, *, progress: Callable[[str], None] | None = None
) -> EmbeddedBroker | EmbeddedCluster:
    """The embedded broker or cluster of `data_dir`: a cluster when `nodes` > 1, or when `nodes`
    is None and the data dir holds one; else the single broker."""
    held = EmbeddedCluster.node_count(data_dir)
    if nodes is None:
        nodes = held or 1
    elif nodes == 1 and held:
        raise EmbeddedBrokerError(
            f"{Path(data_dir)} holds a {held}-node cluster; use --nodes {held} or another --data-dir"
        )
    if nodes > 1:
        return EmbeddedCluster(data_dir, nodes, progress=progress)
    return EmbeddedBroker(data_dir, progress=progress)
