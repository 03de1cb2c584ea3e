"""The embedded Apache Kafka broker, and the broker rule every entry point follows
(resolve_cluster, its only home): an explicit address or Cluster (`--bootstrap`,
`connect(bootstrap=...)`) wins, then KBROKER_BOOTSTRAP, otherwise the embedded broker (or
cluster) recorded in the default data directory, as its secure node's admin when it is secured."""

from __future__ import annotations

import os
from pathlib import Path

from kbroker import config
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.embedded.cluster import embedded_at
from kbroker.embedded.secure import read_properties
from kbroker.errors import BrokerUnavailableError


def resolve_cluster(explicit: ClusterLike | None = None, data_dir: Path | None = None) -> Cluster:
    """The broker rule, as a Cluster: `explicit` (an address or a Cluster), else
    KBROKER_BOOTSTRAP, else the embedded broker running in `data_dir` (the default data directory;
    a secure one with its admin's client properties, so every command works there unconfigured).
    Raises BrokerUnavailableError when nothing is configured or running."""
    if explicit:
        return Cluster.of(explicit)
    env = os.environ.get("KBROKER_BOOTSTRAP")
    if env:
        return Cluster(env)
    status = embedded_at(data_dir or config.default_data_dir()).status()
    if status.running and status.bootstrap:  # the address the embedded broker listens on
        if status.client_properties:
            return Cluster.with_properties(status.bootstrap, read_properties(status.client_properties))
        return Cluster(status.bootstrap)
    raise BrokerUnavailableError(
        "no broker: pass --bootstrap or set KBROKER_BOOTSTRAP, or run 'kbroker broker start'"
    )
