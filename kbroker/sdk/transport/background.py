"""What a started endpoint instance runs beside its readers: the delayed store's mover
(kafka/transport/delayed_store.py) and a pusher per bridge to another cluster
(kafka/transport/bridge.py). TransportEndpoint has these through Background."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.transport.bridge import CLUSTER_RE, bridge_topic
from kbroker.core.transport.delayed import DelayedDelivery
from kbroker.core.transport.endpoint import TransportSettings
from kbroker.errors import InvalidArgumentError, TransportQueueNotFoundError
from kbroker.kafka.profiles import ClusterProfiles
from kbroker.kafka.transport.bridge import BridgePusher
from kbroker.kafka.transport.delayed_store import DelayedMover
from kbroker.sdk.transport.runtime import TransportRuntime

log = logging.getLogger("kbroker.transport")


class Background:
    """The mover and the bridges' pushers of one endpoint instance (mixed into TransportEndpoint)."""

    settings: TransportSettings
    runtime: TransportRuntime
    cluster: Cluster
    namespace: str
    _delayed: DelayedDelivery
    _mover: DelayedMover | None
    _bridges: dict[str, Cluster]
    _pushers: dict[str, BridgePusher]

    def bridges_of(self, bridges: Mapping[str, ClusterLike | None] | None) -> dict[str, Cluster]:
        """The far clusters by name; a name with no address is the client profile of that name."""
        out: dict[str, Cluster] = {}
        for name, where in (bridges or {}).items():
            if not isinstance(name, str) or not CLUSTER_RE.fullmatch(name):
                raise InvalidArgumentError(f"cluster name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
            if where is None:
                out[name] = ClusterProfiles(self.cluster).named(name)
            else:
                out[name] = Cluster.of(where)
        return out

    def start_mover(self) -> DelayedMover | None:
        """Start the mover of this endpoint's delayed store (start() does) unless it runs or this
        is a satellite or send-only; None (said once) when the store was never installed (an
        endpoint installed before delayed delivery existed)."""
        s = self.settings
        if self._mover is not None or s.satellite or s.send_only:
            return self._mover
        try:
            topic = self.runtime.queues.delayed_store(self.settings.name)
        except TransportQueueNotFoundError as exc:
            log.warning("%s: delayed delivery is off: %s", self.settings.name, exc)
            return None
        d = self._delayed
        self._mover = DelayedMover(
            self.cluster,
            self.namespace,
            topic,
            exists=self.runtime.queues.exists,
            batch_size=d.batch_size,
            interval=d.interval,
            budget=d.budget,
        ).start()
        return self._mover

    def start_bridges(self) -> dict[str, BridgePusher]:
        """Start a pusher per bridge (start() does) unless they run or this is send-only."""
        if self._pushers or self.settings.send_only:
            return self._pushers
        for name, far in self._bridges.items():
            topic = bridge_topic(self.namespace, name)
            try:
                self.runtime.queues.topic(f"x@{self.namespace}@{name}")  # the bridge topic, installed?
            except TransportQueueNotFoundError as exc:
                log.warning("%s: the bridge to %s is off: %s", self.settings.name, name, exc)
                continue
            self._pushers[name] = BridgePusher(self.cluster, self.namespace, topic, far).start()
        return self._pushers

    def stop_background(self) -> None:
        """Stop the mover and the pushers."""
        mover, self._mover = self._mover, None
        if mover is not None:
            mover.close()
        pushers, self._pushers = self._pushers, {}
        for pusher in pushers.values():
            pusher.close()

    @property
    def pushers(self) -> dict[str, BridgePusher]:
        """The running pushers, by far cluster."""
        return dict(self._pushers)

    @property
    def mover(self) -> DelayedMover | None:
        """The running mover of this endpoint's delayed store (after start), if any."""
        return self._mover
