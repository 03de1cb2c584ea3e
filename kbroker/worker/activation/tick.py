"""The cluster's tick (docs/sources.md) and its 5th-tick cleanup, as the worker runs them.

    every worker's tick timer -> ticks topic (1 partition) --> `tick_agent`: claim() runs each
        tick number once per cluster -> Tick to every monitor, TICK event on the events topic;
        every 5th tick: the Reclaimer deletes queue records no reader needs

Tick numbers are counted by core/activation/tick.py (claim, through advance), the one tick mechanism of
kbroker: the worker's own periodic work (worker/app.py) counts the same numbers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.activation import monitor_codec as codec
from kbroker.core.activation.monitor import Tick
from kbroker.core.activation.tick import EVERY_5TH, TickOwner, TickSchedule, claim
from kbroker.core.analytics.analytics_records import analytics_row, control_command
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.dialogs.endpoint_records import endpoint_record
from kbroker.core.reader_reports import reader_report
from kbroker.core.rejected import text_key
from kbroker.kafka.receive.reclaim import reclaim_endpoints, reclaim_namespace
from kbroker.kafka.rejects import Rejects, scan
from kbroker.sdk.broker import Broker
from kbroker.worker.guard import Guard
from kbroker.worker.settings import Channels, WorkerSettings, now_ms

log = logging.getLogger("kbroker.worker")

ENDPOINT_RECLAIM_SECONDS = 300.0  # the endpoint scan of the 5th-tick cleanup runs at most this often


class Reclaimer:
    """Seed 000's 5th-tick cleanup, once per cluster, off the tick agent (reading a retained
    queue's prefix may take a while): one run at a time. It holds no clients of its own (each run
    opens and closes what it reads), so there is nothing to close."""

    def __init__(self, s: WorkerSettings, channels: Channels, broker: Broker, guard: Guard):
        self.s, self.channels, self.broker, self.guard = s, channels, broker, guard
        # The records of the topics every process reads whole that are not what they should be:
        # skipped by every reader, recorded here, once per cluster (kafka/rejects.py).
        self.rejects = Rejects(s.cluster, s.namespace, "5th-tick scan")
        self._scanned: dict[str, dict[int, int]] = {}  # topic -> where its last scan ended
        self.running: asyncio.Future[Any] | None = None
        self._endpoints_reclaimed: float | None = None  # monotonic time of the last endpoint scan

    def trigger(self) -> None:
        """Run the cleanup unless a run is in progress."""
        if not self.running:
            self.running = asyncio.ensure_future(self.guard.run("reclaim", self._reclaim))

    def retry_if_failing(self) -> None:
        """This worker's cleanup failed (a coordinator still loading after a broker restart): tried
        again with back-off from here, not at the next 5th tick, which waits for the tick agent's
        consumer group to settle and so kept the worker degraded long after Kafka answered again."""
        if self.guard.health.failing("reclaim") and self.guard.due("reclaim"):
            self.trigger()

    async def _reclaim(self) -> None:
        """Records no queue reader needs are deleted; endpoints closed for longer than the grace
        period are tombstoned (a scan of the endpoints topic, so at most every
        ENDPOINT_RECLAIM_SECONDS, or every closed_grace when shorter)."""
        s = self.s
        try:
            await asyncio.to_thread(
                self.scan,
                names.catalog_topic(s.namespace),
                names.readers_topic(s.namespace),
                names.analytics_topic(s.namespace),
                names.control_topic(s.namespace),
            )
            done = await asyncio.to_thread(lambda: reclaim_namespace(s.cluster, self.broker.catalog))
            every = min(ENDPOINT_RECLAIM_SECONDS, s.closed_grace)  # a short grace is reclaimed as often
            last = -every if self._endpoints_reclaimed is None else self._endpoints_reclaimed
            if time.monotonic() - last >= every:
                self._endpoints_reclaimed = time.monotonic()
                await asyncio.to_thread(self.scan, names.endpoints_topic(s.namespace))
                n = await asyncio.to_thread(reclaim_endpoints, s.cluster, s.namespace, s.closed_grace)
                if n:
                    log.info("reclaimed endpoints=%d closed_for_more_than=%ss", n, s.closed_grace)
        finally:
            self.running = None
        for r in done:
            log.info("reclaimed topic=%s deleted_below=%s", r.topic, r.deleted_below)
            event = {
                "event": "RECORDS_RECLAIMED",
                "topic": r.topic,
                "time": now_ms(),
                "deleted_below": {str(p): o for p, o in r.deleted_below.items()},
            }  # JSON keys
            await self.channels.send_event(r.topic, event)

    def scan(self, *topics: str) -> None:
        """Set aside the bad records of topics every process reads whole (kafka/rejects.py): the
        catalog and endpoints read whole, the others on from where the last scan ended."""
        for topic in topics:
            name = topic.rpartition(".")[2]
            before = self.rejects.rejected
            ends = scan(
                self.rejects,
                topic,
                _DECODERS[name],
                starts=None if name in ("catalog", "endpoints") else self._scanned.get(topic, {}),
            )
            self._scanned[topic] = ends
            if self.rejects.rejected > before:
                log.warning("set aside records=%d topic=%s", self.rejects.rejected - before, topic)


# What each compacted topic the scan reads holds (by the topic's last name part).
_DECODERS: dict[str, Callable[[Any], object]] = {
    "catalog": lambda msg: catalog_record(msg.key(), msg.value()),
    "endpoints": lambda msg: endpoint_record(msg.key(), msg.value()),
    "readers": lambda msg: msg.value() is None or (text_key(msg.key()), reader_report(msg.value())),
    "analytics": lambda msg: analytics_row(msg.key(), msg.value()),
    "control": lambda msg: control_command(msg.key(), msg.value()),
}


class ClusterTick:
    """Every worker asks for a tick on its tick timer; the tick agent (on whichever worker owns
    the ticks topic's one partition) runs each tick number once per cluster."""

    def __init__(self, s: WorkerSettings, channels: Channels, broker: Broker, reclaimer: Reclaimer):
        self.s, self.channels, self.broker, self.reclaimer = s, channels, broker, reclaimer
        self.schedule = TickSchedule(interval=s.tick_interval)

    async def request(self) -> None:
        await self.channels.send(
            self.channels.ticks, b"tick", orjson.dumps({"worker": self.s.worker_id, "now": time.time()})
        )

    async def on_request(self, worker: str, now: float) -> None:
        """A worker asked for a tick (core/activation/monitor_codec.decode_tick_request): run it if this
        tick number is due and unclaimed."""
        table = self.channels.tick_owner
        run, owner = claim(TickOwner.from_dict(table.get("owner")), worker, now, self.schedule)
        table["owner"] = owner.to_dict()
        if run is None:
            return
        queues = await asyncio.to_thread(
            lambda: [q.name for q in self.broker.catalog.queues.values() if q.activation is not None]
        )
        for queue in queues:
            await self.channels.send(self.channels.monitor_events, queue.encode(), codec.encode(Tick()))
        # requested_ms: when the worker asked; `time` - requested_ms is how long the tick took to
        # reach every monitor (kbroker bench scale measures it against the number of queues).
        event = {
            "event": "TICK",
            "number": run.number,
            "due": sorted(run.due),
            "missed": run.missed,
            "worker": worker,
            "requested_ms": int(now * 1000),
            "time": now_ms(),
        }
        await self.channels.send_event("tick", event)
        if EVERY_5TH in run.due:
            self.reclaimer.trigger()
