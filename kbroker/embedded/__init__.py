"""The embedded Apache Kafka broker, and the broker rule every entry point follows: an explicit
bootstrap address (`--bootstrap`, `connect(bootstrap=...)`) wins, then KBROKER_BOOTSTRAP,
otherwise the embedded broker (or cluster) recorded in the default data directory."""

from __future__ import annotations

import os
from pathlib import Path

from kbroker import config
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.embedded.cluster import embedded_at
from kbroker.errors import BrokerUnavailableError


def resolve_cluster(explicit: ClusterLike | None = None, data_dir: Path | None = None) -> Cluster:
    """The broker rule, as a Cluster. Raises BrokerUnavailableError when nothing is configured
    or running."""
    if explicit:
        return Cluster.of(explicit)
    return Cluster(resolve_bootstrap(None, data_dir))


def resolve_bootstrap(explicit: str | None = None, data_dir: Path | None = None) -> str:
    """The broker rule's address. Raises BrokerUnavailableError when nothing is configured or running."""
    if explicit:
        return explicit
    env = os.environ.get("KBROKER_BOOTSTRAP")
    if env:
        return env
    embedded = embedded_at(data_dir or config.default_data_dir())
    status = embedded.status()
    if status.running and status.bootstrap:
        return status.bootstrap
    raise BrokerUnavailableError(
        "no broker: pass --bootstrap or set KBROKER_BOOTSTRAP, or run 'kbroker broker start'"
    )
