"""What each node of the embedded cluster (embedded/cluster.py) is configured with: its ports
and its server.properties. Apart from the cluster, which starts, stops and watches the nodes:
this is configuration only, rewritten at every start."""

from __future__ import annotations

from pathlib import Path

from kbroker.embedded import ports
from kbroker.errors import PortInUseError

Ports = tuple[int, int, int | None]  # a node's (broker, controller, TLS) ports; TLS for a secure one
# Each JVM smaller than the single broker's (256m-1g): N of them share a small machine.
NODE_HEAP = ("-Xms128m", "-Xmx512m")
# Rewritten at every start, from the ports in cluster.json (or new ones when no node runs): the
# quorum is static, so a voter's address is configuration, not stored state. A node's listener
# lines are the single broker's, plain or secure (embedded/secure.py).
_NODE_HEAD = """\
# Written by kbroker at every start; edits are overwritten.
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
"""
_NODE_TAIL = """\
log.dirs={log_dirs}
# Replicated by default, and an acknowledged write is on {min_isr} nodes: one node may be lost.
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
# A queue group's session time-out is 2 s (kafka/receive/group_protocol.py: Kafka's minimum is 6 s for the
# classic protocol, 45 s for the consumer protocol, which kbroker uses only when asked to), and
# a killed process's open transaction is aborted within 1 s of its time-out (Kafka checks every 10 s).
group.consumer.min.session.timeout.ms=1000
group.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=250
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
# A killed node is fenced (its leaderships and ISR places handed over) after the session time-out
# (default 9 s); shorter on loopback, where a heartbeat is never delayed by the network.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
# kbroker creates its topics explicitly.
auto.create.topics.enable=false
num.partitions=1
"""


def new_ports(port: int, node_ids: list[int], secure: bool) -> dict[int, Ports]:
    """Broker ports port..port+N-1 (each must be free); controllers (then a secure cluster's
    TLS listeners) on the next N ports when free, else on any free ones."""
    n = len(node_ids)
    if port + n - 1 > 65535:
        raise PortInUseError(f"ports {port} to {port + n - 1} do not all exist; choose a lower --port")
    brokers = [port + k for k in range(n)]
    for p in brokers:
        if ports.bind(p) is None:
            raise PortInUseError(
                f"port {p} on 127.0.0.1 is already in use (a {n}-node cluster needs ports "
                f"{port} to {port + n - 1}); choose another with --port"
            )
    taken = set(brokers)
    controllers = [ports.claim_port(p, taken) for p in range(port + n, port + 2 * n)]
    tls: list[int | None] = (
        [ports.claim_port(p, taken) for p in range(port + 2 * n, port + 3 * n)] if secure else [None] * n
    )
    return {i: (brokers[k], controllers[k], tls[k]) for k, i in enumerate(node_ids)}


def node_properties(node_id: int, voters: str, listeners: str, log_dirs: Path, replicas: int, min_isr: int) -> str:
    """A node's server.properties."""
    return (_NODE_HEAD + "{listeners}" + _NODE_TAIL).format(
        node_id=node_id, voters=voters, listeners=listeners, log_dirs=log_dirs, replicas=replicas, min_isr=min_isr
    )
