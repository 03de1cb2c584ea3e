"""What a worker is built from: its settings, its own topics, and the Faust topics and tables its
services share (`Channels`). Apart from app.py so that each service module can take them without
importing the app that wires the services."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust
import orjson
from aiokafka.partitioner import murmur2

from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.dialogs.conversation_endpoint import CLOSED_GRACE_SECONDS
from kbroker.errors import is_refusal
from kbroker.kafka.snapshot import check_group
from kbroker.kafka.topics import create_missing_topics, partition_counts
from kbroker.worker.guard import refusal_of

log = logging.getLogger("kbroker.worker")


@dataclass
class WorkerSettings:
    cluster: Cluster  # a bootstrap string is taken as a cluster with no further settings
    namespace: str
    web_port: int = 6066
    web_host: str = "127.0.0.1"  # loopback; anywhere else needs web_token (core/security/web_access.py)
    web_token: str | None = None  # every request to the HTTP API carries it (config.web_token)
    web_allowed_hosts: tuple[str, ...] = ()  # Host names besides web_host and the loopback names
    tick_interval: float = 5.0  # docs/sources.md#periodic-tasks: the broker's periodic tick
    watch_interval: float = 0.25  # a first message launches a reader within about this long
    ramp_up: float = 5.0  # docs/sources.md#queue-monitors: seconds of non-empty RECEIVEs before one more reader
    handlers: int | None = None  # task handler threads; default 2 x CPUs
    # Seconds a queue's receiver in this worker may sit unread (no activated reader asked) before it
    # is closed: it holds Kafka clients and a share of the queue's partitions that other readers
    # of the queue (an application's, with activation OFF) would otherwise never get.
    receiver_idle: float = 60.0
    timers: bool = True  # run the timer service (dialog timers, lifetimes)
    routing: bool = True  # run the dispatcher and the transmitter (messages between namespaces)
    # Modules whose activation procedures this worker runs, besides kbroker's samples (handlers.OWN_PROCEDURE_MODULES).
    allow_procedures: tuple[str, ...] = ()
    closed_grace: float = CLOSED_GRACE_SECONDS  # how long a CLOSED endpoint stays before its tombstone
    log_format: str = "text"  # or "json": one JSON object a line (core/json_logs.py)
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    monitor_partitions: int = names.MONITOR_PARTITIONS  # when this worker creates the monitor-events topic

    def __post_init__(self) -> None:
        self.cluster = Cluster.of(self.cluster)


def ensure_topics(s: WorkerSettings) -> int:
    """The worker's own topics and its tables' changelogs (Faust declares the leader topic), and
    a look at its Faust group: aiokafka would wait for ever, silently, on a group the principal
    may not use, where this raises PermissionDeniedError naming the group. The changelogs are
    made here, before Faust subscribes: a changelog Faust creates itself can be missing from
    the metadata its consumer subscribes with, and its table's recovery then waits for ever
    (seen once under `make test`: "Ignoring missing topic", then no event for minutes).

    Returns
    -------
    The monitor-events topic's partition count: `s.monitor_partitions` when this worker created
    it, else the existing topic's (a warning when that differs from the setting)."""
    monitor_topic = names.monitor_events_topic(s.namespace)
    want = {monitor_topic: s.monitor_partitions, names.ticks_topic(s.namespace): 1}
    created = create_missing_topics(s.cluster, want, {"retention.ms": str(24 * 3600 * 1000)}, replication_factor=1)
    check_group(s.cluster, names.worker_app_id(s.namespace), names.ticks_topic(s.namespace))
    if monitor_topic in created:
        have = s.monitor_partitions
    else:
        have = partition_counts(s.cluster, [monitor_topic]).get(monitor_topic, s.monitor_partitions)
    changelogs = {names.monitors_changelog_topic(s.namespace): have, names.tick_owner_changelog_topic(s.namespace): 1}
    create_missing_topics(s.cluster, changelogs, {"cleanup.policy": "compact"}, replication_factor=1)
    if have != s.monitor_partitions:
        log.warning(
            "%s keeps its %d partitions (--monitor-partitions %d applies to a new namespace only): "
            "up to %d workers share this namespace's monitors",
            monitor_topic,
            have,
            s.monitor_partitions,
            have,
        )
    return have


def monitor_partition(queue: str, partitions: int) -> int:
    """The monitor-events partition of a queue's monitor: where the worker's producer (aiokafka's
    default partitioner, Java's murmur2) puts the queue's events, so where its monitor lives."""
    return int(murmur2(queue.encode()) & 0x7FFFFFFF) % partitions


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Channels:
    """The worker's Faust topics and tables, declared on the app at build time."""

    monitor_events: Any  # faust topic: monitor events, key = queue (ensure_topics's count of partitions)
    ticks: Any  # faust topic: tick requests of every worker (1 partition)
    events: Any  # faust topic: the namespace's events (QUEUE_ACTIVATION, TICK, ...)
    monitors: Any  # faust table: queue -> its monitor row
    tick_owner: Any  # faust table: the cluster-wide tick record
    # Called (on the event loop) with the authorizer's refusal of a send: the worker stops.
    on_refused: Callable[[BaseException], None] | None = None

    @classmethod
    def declare(cls, app: faust.App, s: WorkerSettings, monitor_partitions: int) -> Channels:
        def raw_topic(name: str, partitions: int | None = None) -> Any:
            return app.topic(name, key_serializer="raw", value_serializer="raw", partitions=partitions)

        return cls(
            monitor_events=raw_topic(names.monitor_events_topic(s.namespace), monitor_partitions),
            ticks=raw_topic(names.ticks_topic(s.namespace), 1),
            events=raw_topic(names.events_topic(s.namespace)),
            monitors=app.Table("monitors", default=None, partitions=monitor_partitions),
            tick_owner=app.Table("tick-owner", default=None, partitions=1),
        )

    async def send_event(self, key: str, event: dict[str, Any]) -> None:
        """One event on the namespace's events topic."""
        await self.send(self.events, key.encode(), orjson.dumps(event))

    async def send(self, channel: Any, key: bytes, value: bytes) -> None:
        """Send on one of the Faust topics without waiting for the broker's answer; an answer
        that refuses it (the principal may not write the topic) goes to `on_refused`, rather
        than to asyncio's log of exceptions nobody retrieved."""
        sent = await channel.send(key=key, value=value)
        sent.add_done_callback(self._answered)

    def _answered(self, sent: Any) -> None:
        if sent.cancelled():
            return
        exc = sent.exception()  # retrieved here, whatever it is
        if exc is not None and is_refusal(exc) and self.on_refused is not None:
            self.on_refused(refusal_of(exc, "", operation="WRITE"))
