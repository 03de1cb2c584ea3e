"""The subscription table's topic and an instance's cached copy of it (core/transport/subscriptions.py
says what a record is). A publish asks the copy who subscribes; the copy reads the topic forward
when it is older than its staleness (5 s), so a new subscriber gets the events published at most
that long after it subscribed, as with the transport's cached table."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, Message

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport.subscriptions import (
    STALENESS,
    Subscription,
    SubscriptionTable,
    from_subscription,
    subscriptions_topic,
)
from kbroker.errors import TransportQueueNotFoundError
from kbroker.kafka.catalog.topic_specs import KEEP_EVERY_RECORD, TopicSpec
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions

log = logging.getLogger("kbroker.transport.subscriptions")
COMPONENT = "subscriptions"
READ_SECONDS = 10.0  # the most one read forward of the table waits


def table_spec(ns: str) -> TopicSpec:
    """The installer's topic of the namespace's subscription table: compacted, one partition
    (a handful of records per endpoint; one partition keeps each key's records in order)."""
    config = {"cleanup.policy": "compact", **KEEP_EVERY_RECORD, "min.compaction.lag.ms": "60000"}
    return TopicSpec(subscriptions_topic(ns), 1, config, "transport subscriptions", True)


class SubscriptionCache:
    """One instance's copy of the subscription table, read forward at most every `staleness`
    seconds (and at once after this instance subscribed or unsubscribed). Thread-safe."""

    def __init__(self, cluster: ClusterLike, namespace: str, *, staleness: float = STALENESS):
        self.topic = subscriptions_topic(namespace)
        self.staleness = staleness
        self._cluster = Cluster.of(cluster)
        self._namespace = namespace
        self._table = SubscriptionTable()
        self._positions: dict[int, int] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self.rejects = Rejects(cluster, namespace, COMPONENT, record=True)

    def stale(self) -> None:
        """The next look-up reads the table first (this instance just changed it)."""
        self._read_at = float("-inf")

    def subscribers(self, types: list[str]) -> list[Subscription]:
        """The subscriptions matching any of `types`, one per endpoint (SubscriptionTable)."""
        with self._lock:
            self._refresh()
            return self._table.subscribers(types)

    def all(self) -> list[Subscription]:
        """Every subscription, read up to now."""
        with self._lock:
            self._read_at = float("-inf")
            self._refresh()
            return self._table.all()

    def _refresh(self) -> None:
        if time.monotonic() - self._read_at < self.staleness:
            return
        if self._consumer is None:
            self._consumer = reading_consumer(self._cluster, names.reader_group(self._namespace))
        if not self._positions:
            partitions = topic_partitions(self._consumer, self.topic, READ_SECONDS)
            if partitions is None:
                raise TransportQueueNotFoundError("the subscription table", self.topic)
            self._positions = dict.fromkeys(partitions, 0)
        began = time.monotonic()
        read = read_partitions(self._consumer, self.topic, self._positions, READ_SECONDS, on_record=self._apply)
        self._positions.update(read.positions)
        if not read.unfinished:
            self._read_at = began

    def _apply(self, msg: Message) -> None:
        try:
            key, sub = from_subscription(msg.key(), msg.value())
        except MalformedRecord as exc:  # another client's record: set aside once, never routed to
            self.rejects.reject(msg, str(exc))
            return
        self._table.apply(key, sub)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
        self.rejects.close()
