"""The links of one transmitter or forwarder: which are open, opening one when
core/routing/links.py's rules allow, and noting breaks. Shared so both keep the same suppression."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from kbroker.core.cluster import Cluster
from kbroker.core.routing.links import IDLE_CLOSE, Links
from kbroker.core.routing.routes import parse_address
from kbroker.errors import KBrokerError
from kbroker.kafka.profiles import ClusterProfiles
from kbroker.kafka.routing.link import Invalid, LinkBroken, RoutingLink, Signer

log = logging.getLogger("kbroker.routing.links")
CONNECT_SECONDS = 5.0  # kbroker's deadline on one connection attempt


class LinkPool:
    def __init__(
        self,
        from_broker: str,
        local: Cluster,
        *,
        every_ack: bool = False,
        idle_close: float = IDLE_CLOSE,
        profiles_dir: Path | None = None,
        signer: Signer | None = None,
        on_invalid: Invalid | None = None,
    ):
        """`signer` and `on_invalid`: each connection's (RoutingLink)."""
        self.from_broker, self._every_ack = from_broker, every_ack
        self._signer, self._on_invalid = signer, on_invalid
        self.links = Links(idle_close)
        self.open: dict[str, RoutingLink] = {}
        self.profiles = ClusterProfiles(local, profiles_dir)
        self.profile_of: dict[str, str] = {}  # destination -> the client profile its route names

    def get(self, dest: str, now: float, second_tick: bool) -> RoutingLink | str:
        """The open connection to `dest` (`<bootstrap>/<namespace>`), opened now if the link
        allows; else why not (a transmission status)."""
        link = self.open.get(dest)
        if link is not None:
            return link
        if not self.links.may_connect(dest, now, second_tick):
            state = self.links.link(dest)
            return (
                f"Connection to {dest} is suppressed for {max(0.0, state.suppressed_until - now):.0f} s "
                f"after: {state.last_error or 'a failure'}"
            )
        bootstrap, namespace = parse_address(dest)
        self.links.connecting(dest, now)
        try:
            cluster = self.profiles.cluster_for(bootstrap, self.profile_of.get(dest))
            link = RoutingLink(
                cluster,
                namespace,
                self.from_broker,
                every_ack=self._every_ack,
                signer=self._signer,
                on_invalid=self._on_invalid,
            )
        except KBrokerError as exc:  # a missing profile, settings no client can take
            self.links.failed(dest, time.time(), str(exc))
            log.warning("link to %s failed: %s", dest, exc)
            return f"Connection attempt to {dest} failed: {exc}"
        try:
            link.open(CONNECT_SECONDS)
        except LinkBroken as exc:
            link.close()
            self.links.failed(dest, time.time(), str(exc))
            log.warning("link to %s failed: %s", dest, exc)
            return f"Connection attempt to {dest} failed: {exc}"
        self.links.connected(dest, time.time())
        self.open[dest] = link
        log.info("link to %s connected", dest)
        return link

    def broken(self, link: RoutingLink, now: float, why: str) -> None:
        self.open.pop(link.destination, None)
        link.close()
        self.links.disconnected(link.destination, now, why)
        log.warning("link to %s broke: %s", link.destination, why)

    def poll(self, now: float) -> list[tuple[RoutingLink, list[tuple[str, dict[str, Any]]]]]:
        """Each open connection's new acknowledgements; a connection that broke is noted."""
        out = []
        for link in list(self.open.values()):
            try:
                out.append((link, link.poll()))
            except LinkBroken as exc:
                self.broken(link, now, str(exc))
        return out

    def close_idle(self, now: float, busy: set[str]) -> list[str]:
        """The 5th tick: close connections idle for 90 s that nothing waits for."""
        closed = self.links.idle(now, busy)
        for dest in closed:
            link = self.open.pop(dest, None)
            if link is not None:
                link.close()
            self.links.closed(dest, now)
            log.info("link to %s closed: idle", dest)
        return closed

    def close(self) -> None:
        for link in self.open.values():
            link.close()
        self.open.clear()
