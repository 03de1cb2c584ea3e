"""The leader's look at the queues, on timers of its own (shorter than a tick):

    queue watch (watch_interval): QueueWatcher counts -> MessagesReady, a RECEIVE seen by its
        commit -> ReceiveIssued/Returned, a changed activation -> QueueAltered, to the monitors
    receive progress (PROGRESS_INTERVAL): every queue group's committed offsets, for the
        analytics job (docs/analytics.md)

Both count through one thread pool (`counting_pool`), each queue on its own thread, with one set
of Kafka clients (kafka/activation/counting_clients.py: one offsets reader per queue group, a scanning
consumer per thread).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kbroker.core.activation import monitor_codec as codec
from kbroker.core.activation.monitor import (
    MessagesReady,
    MonitorConfig,
    QueueAltered,
    ReceiveIssued,
    ReceiveReturned,
)
from kbroker.kafka.activation.counting_clients import CountingClients
from kbroker.kafka.activation.watch import QueueCounts, QueueWatcher
from kbroker.kafka.analytics.results import ProgressPublisher
from kbroker.sdk.broker import Broker
from kbroker.worker.guard import Guard
from kbroker.worker.settings import Channels, WorkerSettings

# Seconds between receive progress snapshots (docs/analytics.md): also the analytics job's clock,
# so a message crossing its stale threshold is seen within this plus a trigger or two.
PROGRESS_INTERVAL = 0.5


def counting_pool() -> ThreadPoolExecutor:
    """The threads the queue watch and the receive progress count on (shut down by the worker
    before either closes its clients)."""
    return ThreadPoolExecutor(8, thread_name_prefix="kbroker-count")


class QueueWatch:
    """On the leader: the monitor events that the queues' configs and counts call for. close()
    closes each queue's watcher."""

    def __init__(
        self,
        s: WorkerSettings,
        channels: Channels,
        broker: Broker,
        guard: Guard,
        pool: ThreadPoolExecutor,
        counting: CountingClients,
    ):
        self.s, self.channels, self.broker, self.guard, self.pool = s, channels, broker, guard, pool
        self.counting = counting
        self.watchers: dict[str, QueueWatcher] = {}
        self.configs: dict[str, MonitorConfig] = {}  # each watched queue's config at the last pass
        self._seen: dict[str, QueueCounts] = {}  # each watched queue's counts at the last pass
        self._counted_at: dict[str, float] = {}  # when each queue's counts were last sent to its monitor

    def close(self) -> None:
        for w in self.watchers.values():
            w.close()

    async def once(self) -> None:
        pending = await asyncio.to_thread(self.pending)
        for queue, event in pending:
            await self.channels.send(self.channels.monitor_events, queue.encode(), codec.encode(event))

    def _count(self, name: str) -> QueueCounts | Exception:
        try:
            watcher = self.watchers.get(name)
            if watcher is None:
                watcher = self.watchers[name] = QueueWatcher(
                    self.s.cluster, self.s.namespace, name, clients=self.counting
                )
            # Bounded by half a tick: a coordinator slow to answer (busy with the readers'
            # commits) held the counts, and the view, for the whole 5 s it used to wait.
            return watcher.counts(timeout=min(5.0, max(0.5, self.s.tick_interval / 2)))
        except Exception as exc:  # noqa: BLE001 - reported per queue below
            return exc

    def _watched(self, pending: list[tuple[str, Any]]) -> list[str]:
        """The queues to count; a changed config adds its QueueAltered to `pending`."""
        watched = []
        for q in self.broker.catalog.queues.values():
            cfg = MonitorConfig.from_queue(q, ramp_up=self.s.ramp_up)
            old = self.configs.get(q.name)
            if old is None and q.activation is None:
                continue  # no activation clause: no monitor, so no row to count for
            # A queue whose activation is OFF is counted too: its monitor row (ticked like every
            # queue with an activation clause) shows what waits in it (README, "The worker stays up").
            if old is not None and old != cfg:
                pending.append((q.name, QueueAltered(cfg)))
            self.configs[q.name] = cfg
            watched.append(q.name)
        return watched

    def pending(self) -> list[tuple[str, Any]]:
        """One pass: the monitor events that the queues' configs and counts call for."""
        pending: list[tuple[str, Any]] = []
        watched = self._watched(pending)
        # Each queue is counted by its own watcher (its own consumer), all at once: a pass takes
        # as long as the slowest count, not their sum (one after the other, a pass over five
        # queues whose counts each ran into their 0.5 s bound took 2.5 s, and every row aged by
        # as much).
        for name, counts in zip(watched, self.pool.map(self._count, watched)):
            if isinstance(counts, Exception):
                self.guard.failed(f"counting queue {name}", counts, queue=name)
                continue
            self.guard.succeeded(f"counting queue {name}")
            last = self._seen.get(name)
            now = time.monotonic()
            # Sent when the counts change, and at least twice a tick when they do not: a count
            # that did not reach the monitor (a send lost in a rebalance or an outage) is put
            # right within half a tick instead of standing until the queue changes again, and
            # the view's rows stay well inside two ticks old on a loaded machine.
            if (
                last is None
                or (counts.backlog, counts.ready_groups) != (last.backlog, last.ready_groups)
                or now - self._counted_at.get(name, 0.0) >= self.s.tick_interval / 2
            ):
                pending.append((name, MessagesReady(counts.backlog, counts.ready_groups)))
                self._counted_at[name] = now
            if last is not None and counts.received > last.received:
                # Some RECEIVE committed (from any process): what moves NOTIFIED on.
                pending += [(name, ReceiveIssued()), (name, ReceiveReturned(empty=False))]
            self._seen[name] = counts
        return pending


class ReceiveProgress:
    """On the leader: every queue group's committed offsets, for the analytics job
    (docs/analytics.md). close() closes its publisher."""

    def __init__(self, s: WorkerSettings, broker: Broker, pool: ThreadPoolExecutor, counting: CountingClients):
        self.s, self.broker, self.pool, self.counting = s, broker, pool, counting
        self.publisher: ProgressPublisher | None = None

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def publish(self) -> None:
        publisher = self.publisher
        if publisher is None:
            publisher = self.publisher = ProgressPublisher(self.s.cluster, self.s.namespace, self.counting)
        queues = list(self.broker.catalog.queues)
        snaps = [snap for snap in self.pool.map(lambda q: publisher.snapshot(q, timeout=2.0), queues) if snap]
        publisher.publish(snaps, timeout=2.0)
