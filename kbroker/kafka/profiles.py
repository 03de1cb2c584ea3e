"""Which client settings reach another cluster a route leads to. A route names its destination
by address; the settings (credentials, trust) stay with each process: a client profile is a
properties file `<profiles dir>/<name>.properties` (config.profiles_dir) holding the cluster's
bootstrap.servers and its client settings, as Kafka's tools read them.

For a destination's bootstrap servers, in order: the profile a route names; this process's own
cluster when the servers are its own (its settings); a profile whose bootstrap.servers are those
servers; else no settings (a plaintext cluster)."""

from __future__ import annotations

from pathlib import Path

from kbroker import config
from kbroker.core.cluster import Cluster
from kbroker.core.security.client_properties import read_properties
from kbroker.errors import InvalidArgumentError


def _servers(bootstrap: str) -> frozenset[str]:
    return frozenset(s.strip().rpartition("://")[2].lower() for s in bootstrap.split(",") if s.strip())


class ClusterProfiles:
    """The Cluster each destination is reached with (see the module docstring)."""

    def __init__(self, local: Cluster, directory: Path | None = None):
        self.local, self.directory = local, directory or config.profiles_dir()

    def cluster_for(self, bootstrap: str, profile: str | None = None) -> Cluster:
        """The cluster at `bootstrap` with its settings; InvalidArgumentError for a named profile
        that is missing or lists other servers."""
        if profile:
            found = self._read(self.directory / f"{profile}.properties")
            if found is None:
                raise InvalidArgumentError(f"client profile {profile!r} not found in {self.directory}")
            if _servers(found.bootstrap) != _servers(bootstrap):
                raise InvalidArgumentError(f"client profile {profile!r} is for {found.bootstrap}, not {bootstrap}")
            return found
        if _servers(bootstrap) == _servers(self.local.bootstrap):
            return self.local
        for path in sorted(self.directory.glob("*.properties")) if self.directory.is_dir() else []:
            try:
                found = self._read(path)
            except InvalidArgumentError:
                continue  # a profile no route can use; naming it says why
            if found is not None and _servers(found.bootstrap) == _servers(bootstrap):
                return found
        return Cluster(bootstrap)

    def named(self, profile: str) -> Cluster:
        """The cluster of the client profile `profile`; InvalidArgumentError when it is missing."""
        found = self._read(self.directory / f"{profile}.properties")
        if found is None:
            raise InvalidArgumentError(f"client profile {profile!r} not found in {self.directory}")
        return found

    @staticmethod
    def _read(path: Path) -> Cluster | None:
        try:
            props = read_properties(path.read_text())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read client profile {path}: {exc.strerror or exc}") from None
        bootstrap = props.pop("bootstrap.servers", None)
        if not bootstrap:
            raise InvalidArgumentError(f"client profile {path} names no bootstrap.servers")
        return Cluster.with_properties(bootstrap, props)
