"""The forwarder: passes on messages that reached this namespace for services it does not host,
toward their route, when the namespace's broker endpoint has MESSAGE_FORWARDING = ENABLED.

Run by the dispatcher, which hands it such messages and commits their inbound offsets: from then
on they live in memory only (core/routing/forwarding.py bounds them by MESSAGE_FORWARD_SIZE and drops
those not passed on within 60 s), as Service Broker's forwarded messages do. The sender keeps each
until it is acknowledged, and it reads acknowledgements on this namespace's acks topic, so the
forwarder relays the next hop's acknowledgements of the directions it forwarded into this
namespace's acks topic (only ever raising a direction's number)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.routing.forwarding import Forwarded, ForwardQueue
from kbroker.core.routing.transmission import ack_key
from kbroker.kafka import clients
from kbroker.kafka.routing.link import LinkBroken
from kbroker.kafka.routing.link_pool import LinkPool
from kbroker.kafka.routing.views import ReportWriter

log = logging.getLogger("kbroker.forwarder")
RELAYED_KEPT = 100_000  # directions whose relayed acknowledgement is remembered


class Forwarder:
    def __init__(self, cluster: ClusterLike, namespace: str, limit_bytes: int):
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        self.queue = ForwardQueue(limit_bytes)
        self.pool = LinkPool(namespace, self.cluster, every_ack=True)
        # Ack key of each direction forwarded -> the highest `next` relayed for it (-1: none yet),
        # oldest first: the acknowledgements to relay, and which to forget first.
        self._relayed: dict[str, int] = {}
        self._producer = clients.idempotent_producer(cluster)
        # sys.dm_broker_forwarded_messages, for `kbroker forwarded`
        self._reports = ReportWriter(self._producer, namespace, "forwarder")
        self.relayed = 0

    def offer(self, m: Forwarded) -> None:
        """Hold `m` to pass on, unless the size cap drops it."""
        if self.queue.add(m):
            key = ack_key(m.from_broker, m.conversation_id, "TARGET" if m.is_initiator else "INITIATOR")
            self._relayed[key] = self._relayed.pop(key, -1)  # to the newest end
            while len(self._relayed) > RELAYED_KEPT:
                del self._relayed[next(iter(self._relayed))]
        else:
            log.warning(
                "forwarder full (%d of %d bytes): message %s dropped; its sender sends it again",
                self.queue.bytes,
                self.queue.limit,
                m.message_id,
            )

    def pump(self, now: float, second_tick: bool) -> None:
        """Pass on what is held over each next hop's connection, and relay acknowledgements."""
        for dest in self.queue.destinations():
            link = self.pool.get(dest, now, second_tick)
            if isinstance(link, str):
                continue
            for m in self.queue.for_destination(dest):
                try:
                    link.send_record(m.record[0], m.record[1], m.record[2])
                except LinkBroken as exc:
                    self.pool.broken(link, now, str(exc))
                    break
                self.queue.passed_on(m)
                self.pool.links.active(dest, now, sends=1, size=m.size)
        for _, acks in self.pool.poll(now):
            for key, ack in acks:
                self._relay(key, ack)
        self._reports.publish(now, lambda: self.report(now))

    def _relay(self, key: str, ack: dict[str, Any]) -> None:
        relayed = self._relayed.get(key)
        if relayed is None:
            return
        nxt = int(ack.get("next", 0))
        if nxt <= relayed and not ack.get("error") and not ack.get("status"):
            return
        self._relayed[key] = max(nxt, relayed)
        clients.produce(
            self._producer,
            names.acks_topic(self.namespace),
            key=key,
            value=orjson.dumps({**ack, "relayed_by": self.namespace}),
        )
        self._producer.poll(0)
        self.relayed += 1

    def sweep(self, now: float) -> None:
        """The 5th tick: messages not passed on within 60 s of arriving are deleted."""
        stale = self.queue.sweep(now)
        if stale:
            log.info("forwarder deleted %d message(s) not sent on within 60 s", len(stale))

    def report(self, now: float) -> dict[str, Any]:
        return {
            "at": now,
            "forwarded": self.queue.rows(now),
            "held_bytes": self.queue.bytes,
            "limit_bytes": self.queue.limit,
            "sent": self.queue.sent,
            "dropped_full": self.queue.dropped_full,
            "dropped_stale": self.queue.dropped_stale,
            "relayed_acks": self.relayed,
            "connections": self.pool.links.rows(now),
        }

    def close(self) -> None:
        self.pool.close()
        self._reports.close()
        self._producer.flush(2)
