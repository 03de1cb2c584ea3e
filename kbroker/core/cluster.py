"""Where kbroker's Kafka is: one immutable value with the bootstrap servers and every client
setting a Kafka client needs there (security ones included), so that adding TLS or SASL touches
this value and the one factory that builds clients from it (kafka/clients.py), not every class
that happens to connect.

Settings are Kafka client properties under the names every Kafka tool reads
(`security.protocol`, `sasl.mechanism`, `ssl.truststore.location`, ...), as a properties file or
`--command-config` gives them; each client kbroker runs (librdkafka, aiokafka, Spark's Kafka
source) gets them translated by the factory. `bootstrap.servers` is never one of them: it is the
value's `bootstrap`.

An entry point that takes a cluster also takes its bootstrap string (`ClusterLike`): a string is
a cluster with no further settings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Cluster:
    """A Kafka cluster as kbroker's clients reach it."""

    bootstrap: str
    settings: tuple[tuple[str, str], ...] = field(default=())  # sorted (name, value) pairs

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap, str) or not self.bootstrap.strip():
            raise ValueError(f"a Kafka cluster needs bootstrap servers, not {self.bootstrap!r}")
        names = [n for n, _ in self.settings]
        if "bootstrap.servers" in names:
            raise ValueError("bootstrap.servers is the cluster's bootstrap, not one of its settings")
        if len(set(names)) != len(names):
            raise ValueError(f"a setting is given twice: {sorted(names)}")

    @classmethod
    def of(cls, where: "ClusterLike") -> "Cluster":
        """`where` as a Cluster: a bootstrap string is a cluster with no further settings."""
        return where if isinstance(where, Cluster) else cls(where)

    @classmethod
    def with_properties(cls, bootstrap: str, properties: Mapping[str, str] | Iterable[tuple[str, str]]) -> "Cluster":
        """A cluster at `bootstrap` with Kafka client `properties` (a properties file's pairs)."""
        pairs = dict(properties.items() if isinstance(properties, Mapping) else properties)
        return cls(bootstrap, tuple(sorted((str(k), str(v)) for k, v in pairs.items())))

    @property
    def properties(self) -> dict[str, str]:
        """The client settings beside the bootstrap servers, by their Kafka names."""
        return dict(self.settings)

    def __str__(self) -> str:
        return self.bootstrap  # what logs, addresses and a `--bootstrap` flag show

    def __repr__(self) -> str:
        # Settings hold credentials (sasl.password, ssl.key.password): a repr, a log line or a
        # traceback shows their names only.
        return f"Cluster({self.bootstrap!r}, settings={[n for n, _ in self.settings]})"


ClusterLike = Union[Cluster, str]
