"""The embedded Apache Kafka broker, and the broker rule every entry point follows
(resolve_cluster, its only home): an explicit Cluster wins whole; otherwise the bootstrap comes
from an explicit address (`--bootstrap`, `connect(bootstrap=...)`), then KBROKER_BOOTSTRAP, then
the client properties' `bootstrap.servers`, and the client settings from the properties file
(`--command-config` / KBROKER_COMMAND_CONFIG) and KBROKER_KAFKA_* variables; with none of those,
the embedded broker (or cluster) recorded in the default data directory, with its own client
settings when it runs secured."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kbroker import config
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.security.client_properties import COMMAND_CONFIG_ENV, properties_from_env, read_properties
from kbroker.embedded import secure
from kbroker.embedded.cluster import embedded_at
from kbroker.errors import BrokerUnavailableError, InvalidArgumentError


def client_properties(
    command_config: Path | str | None = None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The Kafka client properties the user gives: the properties file (`command_config`, else
    KBROKER_COMMAND_CONFIG), then KBROKER_KAFKA_* variables over it."""
    path = command_config or environ.get(COMMAND_CONFIG_ENV)
    props: dict[str, str] = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidArgumentError(
                f"cannot read the client properties file {path}: {exc.strerror or exc}"
            ) from None
        props = read_properties(text)
    return {**props, **properties_from_env(environ)}


def resolve_cluster(
    explicit: ClusterLike | None = None, data_dir: Path | None = None, command_config: Path | str | None = None
) -> Cluster:
    """The broker rule, as a Cluster (see the module docstring). Raises BrokerUnavailableError
    when nothing is configured or running."""
    if isinstance(explicit, Cluster):
        return explicit
    props = client_properties(command_config)
    listed = props.pop("bootstrap.servers", None)
    bootstrap = explicit or os.environ.get("KBROKER_BOOTSTRAP") or listed
    if bootstrap:
        return Cluster.with_properties(bootstrap, props)
    status = embedded_at(data_dir or config.default_data_dir()).status()
    if status.running and status.bootstrap:  # the address the embedded broker listens on
        if not props and status.client_properties:
            # A secure embedded broker: its admin's settings, so every command works unconfigured.
            return Cluster.with_properties(status.bootstrap, secure.read_properties(status.client_properties))
        return Cluster.with_properties(status.bootstrap, props)
    raise BrokerUnavailableError("no broker: pass --bootstrap or set KBROKER_BOOTSTRAP, or run 'kbroker broker start'")
