"""`kbroker broker ...`: the embedded Apache Kafka broker (start, stop, status, fetch), and the
users of a secure one (`broker user add/remove`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kbroker import config
from kbroker.cli.common import emit_json, handle_errors, json_option, main

if TYPE_CHECKING:
    from kbroker.embedded.broker import BrokerStatus, EmbeddedBroker
    from kbroker.embedded.cluster import ClusterStatus, EmbeddedCluster

data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the broker's data, config and log (default: KBROKER_DATA_DIR, "
    "else ~/.local/share/kbroker/broker).",
)


def _embedded(
    data_dir: Path | None, quiet: bool = False, nodes: int | None = None
) -> "EmbeddedBroker | EmbeddedCluster":
    """The single broker or the cluster of the data dir (see embedded_at)."""
    # Imported here so `kbroker --help` stays fast.
    from kbroker.embedded.cluster import embedded_at

    progress = None if quiet else (lambda msg: click.echo(msg, err=True))
    return embedded_at(data_dir or config.default_data_dir(), nodes, progress=progress)


@main.group()
def broker() -> None:
    """The embedded Apache Kafka broker (one KRaft node on 127.0.0.1, or a replicated cluster
    of several with --nodes)."""


@broker.command()
@data_dir_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=9092,
    show_default=True,
    help="Port of the listener clients connect to, PLAINTEXT or with --secure SASL_SSL "
    "(a cluster's nodes take PORT, PORT+1, ...).",
)
@click.option(
    "--controller-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port of the KRaft controller listener (default: port+1 if free, else any). "
    "One node only: a cluster's controllers take the ports after its brokers' when free.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=None,
    help="Nodes (each a broker and a controller) of a replicated cluster: topics get "
    "3 replicas (2 in sync) once there are 3 nodes. Default: what the data dir holds, "
    "else 1.",
)
@click.option(
    "--secure",
    is_flag=True,
    default=False,
    help="A secured broker (or cluster): TLS only, SCRAM-SHA-512 or PLAIN logins on --port, "
    "client certificates on --tls-port, ACLs. Only for a new data dir; a secure one "
    "restarts secure without it. Prints the admin's client properties file.",
)
@click.option(
    "--tls-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="With --secure, one node: port of the listener for client certificates "
    "(default: port+2 if free, else any; a cluster's follow its controllers').",
)
@click.option("--wait", type=float, default=90.0, show_default=True, help="Seconds to wait for the broker to answer.")
@json_option
@handle_errors
def start(
    data_dir: Path | None,
    port: int,
    controller_port: int | None,
    nodes: int | None,
    secure: bool,
    tls_port: int | None,
    wait: float,
    as_json: bool,
) -> None:
    """Start the broker (no-op if it already runs) and print its bootstrap address (and a
    secure one's admin client properties file)."""
    from kbroker.embedded.cluster import EmbeddedCluster

    embedded = _embedded(data_dir, nodes=nodes)
    # Without --secure: as the data dir was formatted (a secure one restarts secure).
    wanted = True if secure else None
    if isinstance(embedded, EmbeddedCluster):
        if controller_port is not None or tls_port is not None:
            raise ValueError("--controller-port and --tls-port are for one node; a cluster picks its ports")
        status: BrokerStatus | ClusterStatus = embedded.start(port=port, wait=wait, secure=wanted)
    else:
        if tls_port is not None and not secure and not embedded.secure_files.enabled:
            raise ValueError("--tls-port is for a secure broker (--secure)")
        status = embedded.start(port=port, controller_port=controller_port, wait=wait, secure=wanted, tls_port=tls_port)
    if as_json:
        emit_json(status.as_dict())
    else:
        click.echo(status.bootstrap)
        if status.client_properties:
            click.echo(status.client_properties)


@broker.command()
@data_dir_option
@click.option(
    "--node",
    type=int,
    default=None,
    help="Stop only this node of a cluster (its node id, 1..N); `start` brings it back.",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for a clean shutdown before killing the JVM.",
)
@json_option
@handle_errors
def stop(data_dir: Path | None, node: int | None, timeout: float, as_json: bool) -> None:
    """Stop the broker (every node of a cluster) cleanly."""
    from kbroker.embedded.cluster import EmbeddedCluster

    embedded = _embedded(data_dir)
    if node is None:
        was_running = embedded.stop(timeout=timeout)
    elif isinstance(embedded, EmbeddedCluster):
        was_running = embedded.stop_node(node, timeout=timeout)
    else:
        raise ValueError("--node is for a cluster; this data dir holds a single broker")
    if as_json:
        emit_json({"stopped": was_running, **embedded.status().as_dict()})
    else:
        click.echo("stopped" if was_running else "not running")


@broker.command()
@data_dir_option
@json_option
@handle_errors
def status(data_dir: Path | None, as_json: bool) -> None:
    """Show whether the broker runs (exit status 0 either way)."""
    from kbroker.embedded.cluster import ClusterStatus

    st = _embedded(data_dir, quiet=True).status()
    if as_json:
        emit_json(st.as_dict())
    elif isinstance(st, ClusterStatus):
        if not st.running:
            click.echo(f"not running ({len(st.nodes)}-node cluster, data dir {st.data_dir})")
            return
        click.echo(
            f"running at {st.bootstrap} ({st.nodes_running} of {len(st.nodes)} nodes, "
            f"Apache Kafka {st.version}, data dir {st.data_dir})"
        )
        for n in st.nodes:
            state = f"running (pid {n.pid})" if n.running else "not running"
            tls = f", TLS {n.tls_port}" if n.tls_port else ""
            click.echo(f"  node {n.node_id}: 127.0.0.1:{n.port} (controller {n.controller_port}{tls}) {state}")
        if st.secure:
            click.echo(
                f"  secure: SASL_SSL (SCRAM-SHA-512, PLAIN) at {st.bootstrap}, "
                f"client certificates at {st.tls_bootstrap}"
            )
            click.echo(f"  admin client properties: {st.client_properties}")
    elif st.running:
        click.echo(f"running at {st.bootstrap} (pid {st.pid}, Apache Kafka {st.version}, data dir {st.data_dir})")
        if st.secure:
            click.echo(
                f"  secure: SASL_SSL (SCRAM-SHA-512, PLAIN) at {st.bootstrap}, "
                f"client certificates at 127.0.0.1:{st.tls_port}"
            )
            click.echo(f"  admin client properties: {st.client_properties}")
    else:
        click.echo(f"not running ({'secure, ' if st.secure else ''}data dir {st.data_dir})")


@broker.command()
@handle_errors
def fetch() -> None:
    """Download the Apache Kafka jars into the cache (done by `start` when needed)."""
    from kbroker.embedded.jvm import fetch_jars

    click.echo(str(fetch_jars(lambda msg: click.echo(msg, err=True))))


@broker.group()
def user() -> None:
    """Users of a secure broker (`start --secure`): SCRAM-SHA-512 and PLAIN logins and client
    certificates, each with client properties files in the data dir's `secure` dir."""


@user.command("add")
@click.argument("name")
@data_dir_option
@json_option
@handle_errors
def user_add(name: str, data_dir: Path | None, as_json: bool) -> None:
    """Add user NAME (or give it a new password): a random password for SCRAM-SHA-512 (now) and
    PLAIN (from the next broker start), a client certificate, and its client properties files,
    whose paths are printed. The user may do nothing until ACLs allow it."""
    files = _embedded(data_dir, quiet=True).add_user(name)
    if as_json:
        emit_json({"user": name, "plain_after_restart": True, **{k: str(v) for k, v in files.items()}})
        return
    click.echo(f"{files['scram']}\t(SCRAM-SHA-512)")
    click.echo(f"{files['plain']}\t(PLAIN: takes effect at the next broker restart)")
    click.echo(f"{files['mtls']}\t(client certificate CN={name}, on the TLS port)")
    click.echo(f"user {name} has no ACLs yet: it is denied every topic, group and transactional id", err=True)


@user.command("remove")
@click.argument("name")
@data_dir_option
@json_option
@handle_errors
def user_remove(name: str, data_dir: Path | None, as_json: bool) -> None:
    """Remove user NAME: its SCRAM-SHA-512 credential (now), its PLAIN login (from the next broker
    start) and its files. Its client certificate stays valid until it expires, for a user that
    holds no ACLs."""
    existed = _embedded(data_dir, quiet=True).remove_user(name)
    if as_json:
        emit_json({"user": name, "removed": existed})
        return
    if not existed:
        click.echo(f"no user {name}")
        return
    click.echo(
        f"removed user {name}: SCRAM-SHA-512 credential deleted; its PLAIN login ends at the "
        "next broker restart; its client certificate stays valid until it expires, but the user "
        "holds no ACLs"
    )
