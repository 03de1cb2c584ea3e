"""The worker's `/metrics` page (Prometheus's text format) and the gauges it collects when
scraped: the queue monitors this worker owns (each monitor lives in exactly one worker, so a sum
over workers counts each queue once) and its activated readers. The counters and histograms the
worker's own transactions add to are kbroker/metrics.py's, in the same registry.

    GET /metrics   behind the same gate as every other page: a worker bound off loopback needs
                   its token, which Prometheus sends as `authorization: {credentials: <token>}`
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kbroker.core.activation.monitor import MonitorStatus
from kbroker.core.routing.links import CLOSED, CONNECTED, CONNECTING, NEW

LINK_STATES = (NEW, CONNECTING, CONNECTED, CLOSED)
Backlog = dict[str, tuple[int, float]]  # destination -> (messages held, the oldest's age in seconds)


class WorkerCollector(Collector):
    """Gauges read at scrape time from `monitors` (the owned part of the monitor table, as
    (queue, stored monitor dict) pairs), `readers` (the task handlers' rows) and `routing` (this
    worker's transmitter's backlog per destination and link states, None while it has none)."""

    def __init__(
        self,
        namespace: str,
        worker_id: str,
        monitors: Callable[[], Iterable[tuple[str, dict[str, Any]]]],
        readers: Callable[[], list[dict[str, Any]]],
        slots: int,
        routing: Callable[[], tuple[Backlog, dict[str, str]] | None] = lambda: None,
    ):
        self.namespace, self.worker_id, self._monitors, self._readers, self._slots, self._routing = (
            namespace,
            worker_id,
            monitors,
            readers,
            slots,
            routing,
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ns = self.namespace
        labels = ["namespace", "queue"]
        backlog = GaugeMetricFamily(
            "kbroker_queue_backlog_messages",
            "Ready messages of an activated queue, as its monitor last counted them.",
            labels=labels,
        )
        groups = GaugeMetricFamily(
            "kbroker_queue_ready_groups",
            "Conversation groups holding ready messages, as the queue's monitor last counted them.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "kbroker_queue_tasks_waiting",
            "Sessions inside a RECEIVE on the queue (sys.dm_broker_queue_monitors).",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "kbroker_queue_monitor_state",
            "The queue monitor's state: 1 for the state it is in, 0 for the others.",
            labels=["namespace", "queue", "state"],
        )
        for queue, stored in sorted((q, m) for q, m in self._monitors() if isinstance(q, str)):
            backlog.add_metric([ns, queue], count(stored.get("backlog")))
            groups.add_metric([ns, queue], count(stored.get("ready_groups")))
            waiting.add_metric([ns, queue], count(stored.get("tasks_waiting")))
            for status in MonitorStatus:
                state.add_metric([ns, queue, status.value], 1.0 if stored.get("state") == status.value else 0.0)
        running = GaugeMetricFamily(
            "kbroker_readers_running", "Activated readers this worker runs, per queue.", labels=labels
        )
        per_queue: dict[str, int] = {}
        for row in self._readers():
            per_queue[row["queue"]] = per_queue.get(row["queue"], 0) + 1
        for queue, n in sorted(per_queue.items()):
            running.add_metric([ns, queue], float(n))
        slots = GaugeMetricFamily(
            "kbroker_reader_slots", "Task handlers this worker has for activated readers.", labels=["namespace"]
        )
        slots.add_metric([ns], float(self._slots))
        yield from (backlog, groups, waiting, state, running, slots)
        yield from self._transmission()

    def _transmission(self) -> Iterator[GaugeMetricFamily]:
        routing = self._routing()
        if routing is None:
            return
        held, links = routing
        ns, labels = self.namespace, ["namespace", "destination"]
        count = GaugeMetricFamily(
            "kbroker_transmission_backlog_messages",
            "Routed messages this worker's transmitter holds unacknowledged, per destination "
            '("" while they have none: no route yet).',
            labels=labels,
        )
        age = GaugeMetricFamily(
            "kbroker_transmission_oldest_age_seconds",
            "Age of the oldest unacknowledged routed message, per destination.",
            labels=labels,
        )
        for dest, (n, oldest) in sorted(held.items()):
            count.add_metric([ns, dest], float(n))
            age.add_metric([ns, dest], oldest)
        link = GaugeMetricFamily(
            "kbroker_link_state",
            "The connection to a destination: 1 for the state it is in, 0 for the others.",
            labels=["namespace", "destination", "state"],
        )
        for dest, current in sorted(links.items()):
            for name in dict.fromkeys((*LINK_STATES, current)):
                link.add_metric([ns, dest, name], 1.0 if name == current else 0.0)
        yield from (count, age, link)


def count(value: Any) -> float:
    """A stored count as a gauge's value: 0 for none, or for anything that is no count (the
    monitor table is restored from its changelog topic, which another client may have written)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(value)


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus's text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def register(collector: Collector) -> Callable[[], None]:
    """Add `collector` to the default registry; returns what removes it."""
    REGISTRY.register(collector)
    return lambda: REGISTRY.unregister(collector)
