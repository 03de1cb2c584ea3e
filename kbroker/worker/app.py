"""The worker: a Faust app that runs queue monitors, activated readers, the cluster tick and the
timer service of one namespace. This module builds the app and wires the services it is made of;
each service is a small class with its own lifecycle, and the decisions are in core/ (monitor.py,
tick.py):

    monitors.py  Monitors: the `monitor_agent` steps each queue's monitor (a Faust table) and
                 launches readers on the task handlers; the readers' RECEIVEs come back as events
    tick.py      ClusterTick: every worker's tick timer asks, the `tick_agent` runs each tick
                 number once per cluster; Reclaimer: its 5th-tick cleanup
    watch.py     QueueWatch (leader timer, watch_interval): counts -> the monitors;
                 ReceiveProgress (leader timer, 0.5 s): committed offsets for the analytics job
    control.py   Routing: timer service, dispatcher, transmitter; Reclassifier: RECLASSIFY
                 commands, every 2nd tick
    pages.py     /monitors/, /conversations/, /dialogs/, /tasks/; dashboard.py: /dashboard
    logs.py      the process's logging: repeated lines held back, JSON lines when asked

A monitor lives in whichever worker owns its partition; its state is in a Faust table, so when
that worker dies another restores it from the changelog. The readers it counted died with the
old worker (or finish on their own after a clean hand-over), so the new owner recycles the
monitor: a fresh generation, whose backlog launches readers at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faust

from kbroker.core import names
from kbroker.core.activation import monitor_codec as codec
from kbroker.core.activation.tick import EVERY_2ND, TickCounter, advance
from kbroker.core.rejected import Consumed, Rejected, text_key
from kbroker.core.security.client_security import AIOKAFKA, LIBRDKAFKA
from kbroker.errors import PermissionDeniedError, is_refusal
from kbroker.kafka.activation.counting_clients import CountingClients
from kbroker.kafka.clients import MAX_MESSAGE_BYTES, aiokafka_settings, faust_broker, principal, security
from kbroker.kafka.rejects import Rejects
from kbroker.sdk.broker import Broker
from kbroker.worker.activation.handlers import TaskHandlers
from kbroker.worker.activation.monitors import Monitors
from kbroker.worker.activation.tick import ClusterTick, Reclaimer
from kbroker.worker.activation.watch import PROGRESS_INTERVAL, QueueWatch, ReceiveProgress, counting_pool
from kbroker.worker.bounded_app import WorkerApp
from kbroker.worker.control import Reclassifier, Routing
from kbroker.worker.guard import Guard, refusal_of
from kbroker.worker.logs import install_log_limit, json_logging_config, write_log_summaries
from kbroker.worker.settings import Channels, WorkerSettings, ensure_topics
from kbroker.worker.tables import WorkerTable
from kbroker.worker.web.dashboard import add_dashboard
from kbroker.worker.web.feed import DashboardFeed
from kbroker.worker.web.pages import Pages
from kbroker.worker.web.web_guard import access_of, web_options, web_pages_off

__all__ = ["Worker", "WorkerSettings", "build_app", "run_worker", "shutdown"]

log = logging.getLogger("kbroker.worker")

METADATA_MAX_AGE_MS = 10_000  # how soon the worker's consumer sees a topic it missed (new_app)


@dataclass
class Worker:
    """One worker's runtime: the Faust app and the services it is made of (what the CLI and
    shutdown() look at). start() runs once on the event loop; close() after the app stopped."""

    settings: WorkerSettings
    app: faust.App
    datadir: tempfile.TemporaryDirectory[str]  # Faust's datadir; the tables are in memory
    channels: Channels
    guard: Guard
    broker: Broker
    monitors: Monitors
    reclaimer: Reclaimer
    cluster_tick: ClusterTick
    counting_pool: ThreadPoolExecutor
    counting: CountingClients  # the Kafka clients the queue watch and the receive progress share
    queue_watch: QueueWatch
    progress: ReceiveProgress
    routing: Routing
    reclassifier: Reclassifier
    pages: Pages
    dashboard: DashboardFeed
    rejects: Rejects  # the worker's agents' records that are not events (set aside, once per cluster)
    ticks: TickCounter = field(default_factory=TickCounter)  # this worker's count of tick numbers
    refused: PermissionDeniedError | None = None  # the authorizer's refusal the worker stopped on

    @property
    def handlers(self) -> TaskHandlers:
        return self.monitors.handlers

    async def start(self) -> None:
        self.monitors.start()
        install_log_limit()
        await self.guard.run("timer service", self.start_timer_service)
        await self.guard.run("routing", self.start_routing)
        self.pages.start()
        s = self.settings
        log.info(
            "worker started worker=%s namespace=%s http=%s:%d (%s)",
            s.worker_id,
            s.namespace,
            s.web_host,
            s.web_port,
            "token required" if s.web_token else "no token",
        )

    async def start_timer_service(self) -> None:
        await asyncio.to_thread(self.routing.start_timer_service)

    async def start_routing(self) -> None:
        await asyncio.to_thread(self.routing.start_routing)

    async def on_tick_timer(self) -> None:
        """This worker's tick: every firing asks for the cluster's tick and looks after the
        worker's own services; the tasks of every 2nd tick run when its tick numbers say so.
        Each part on its own: a broker that is down fails the catalog refresh, which must
        neither stop the worker nor keep the handler threads from being replaced."""
        # Counted by tick number, as the cluster's tick and the routing services count: a late
        # firing carries the 2nd-tick set if a 2nd tick passed; the upkeep below runs at every firing.
        self.ticks, run = advance(self.ticks, time.time(), self.cluster_tick.schedule)
        due = run.due if run is not None else frozenset()
        install_log_limit()
        guard = self.guard
        await guard.run("tick request", self.cluster_tick.request)
        await guard.run("task handlers", self.restart_handlers)
        await guard.run("idle receivers", self.close_idle_receivers)
        await guard.run("catalog refresh", self.refresh_catalog)
        await guard.run("timer service", self.start_timer_service)
        await guard.run("routing", self.start_routing)
        await guard.run("reclassification", functools.partial(self.reclassify, EVERY_2ND in due))
        self.reclaimer.retry_if_failing()
        write_log_summaries()

    async def restart_handlers(self) -> None:
        self.handlers.restart_dead()  # a per-worker every-tick task

    async def close_idle_receivers(self) -> None:
        """Close the queue receivers no activated reader has used for `receiver_idle` s."""
        closed = await asyncio.to_thread(self.broker.runtime.close_idle_receivers, self.settings.receiver_idle)
        for key in closed:  # (queue, secondary queue's instance or None)
            log.info("receiver closed after %g s unread: %s", self.settings.receiver_idle, key)

    async def refresh_catalog(self) -> None:
        await asyncio.to_thread(self.broker.refresh_catalog)  # ALTER QUEUE from any process reaches the monitors

    async def reclassify(self, due: bool) -> None:
        if due:
            await asyncio.to_thread(self.reclassifier.read)

    async def publish_progress(self) -> None:
        await asyncio.to_thread(self.progress.publish)

    def refuse(self, exc: BaseException) -> None:
        """Stop the worker on the authorizer's refusal (from any thread): logged once, as one
        line naming the principal, the operation and the resource, and the Faust app crashed
        with it, so the process exits non-zero (run_worker) instead of retrying for ever."""
        if self.refused is not None:
            return
        self.refused = refusal_of(exc, principal(self.settings.cluster))
        log.critical("%s: the worker stops", self.refused)
        loop, reason = self.app.loop, self.refused
        try:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.app.crash(reason)))
        except RuntimeError:  # the loop has closed: the worker is stopping anyway
            pass

    def close(self) -> None:
        """Each service, those that use others first; the counting threads before the clients
        they count with."""
        self.dashboard.close()
        self.routing.close()
        self.monitors.close()
        self.counting_pool.shutdown(wait=True)
        self.progress.close()
        self.reclassifier.close()
        self.queue_watch.close()
        self.counting.close()
        self.broker.close()
        self.rejects.close()
        self.pages.close()
        self.datadir.cleanup()


def broker_credentials(s: WorkerSettings) -> faust.types.auth.CredentialsT | None:
    """The cluster's security settings as Faust credentials (None for plaintext)."""
    c = aiokafka_settings(s.cluster)
    if c["sasl_mechanism"]:
        return faust.SASLCredentials(
            username=c["username"], password=c["password"], mechanism=c["sasl_mechanism"], ssl_context=c["ssl_context"]
        )
    if c["ssl_context"] is not None:
        return faust.SSLCredentials(c["ssl_context"])
    return None


def new_app(s: WorkerSettings, datadir: str, monitor_partitions: int) -> faust.App:
    return WorkerApp(
        names.worker_app_id(s.namespace),
        broker=faust_broker(s.cluster),
        store="memory://",
        broker_credentials=broker_credentials(s),
        **web_options(s),
        datadir=datadir,
        topic_partitions=monitor_partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        broker_session_timeout=10,
        broker_heartbeat_interval=2,
        consumer_auto_offset_reset="earliest",
        Table=WorkerTable,
        # Any record a kbroker topic takes (core/topic_limits.py), not aiokafka's 1 MB: the
        # worker's own topics keep Kafka's default of 1 MiB and a little more, which aiokafka's
        # default fetch size of exactly 1 MiB is short of.
        producer_max_request_size=MAX_MESSAGE_BYTES,
        consumer_max_fetch_size=MAX_MESSAGE_BYTES,
        # A topic the consumer subscribes to before its metadata shows it (just created, on a
        # busy cluster) is left out of the assignment until aiokafka next refreshes metadata:
        # with the default 5 minutes, a worker started beside 500 new queues held no partition,
        # so no monitor, tick or watch, for minutes. Within 10 s the group rebalances instead.
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
    )


def build_app(s: WorkerSettings) -> tuple[faust.App, Worker]:
    """The Faust app, and the worker runtime tests and the CLI look at."""
    # Settings one of the worker's clients cannot take stop it here, named, before any connects.
    security(s.cluster).check(LIBRDKAFKA, AIOKAFKA)
    access_of(s)  # so does a web server bound off loopback without a token
    monitor_partitions = ensure_topics(s)
    datadir = tempfile.TemporaryDirectory(prefix="kbroker-worker-")
    app = new_app(s, datadir.name, monitor_partitions)
    web_pages_off(app)
    channels = Channels.declare(app, s, monitor_partitions)
    guard = Guard(log)
    broker = Broker(s.cluster, s.namespace)
    monitors = Monitors(s, channels, broker, guard)
    reclaimer = Reclaimer(s, channels, broker, guard)
    pool, counting = counting_pool(), CountingClients(s.cluster, s.namespace)
    routing = Routing(s, broker, guard)
    reclassifier = Reclassifier(s, routing)
    pages = Pages(
        s,
        monitors.handlers,
        guard,
        reclassifier.reclassified,
        lambda: list(channels.monitors.items()),
        lambda: routing.transmitter,
    )
    worker = Worker(
        settings=s,
        app=app,
        datadir=datadir,
        channels=channels,
        guard=guard,
        broker=broker,
        monitors=monitors,
        reclaimer=reclaimer,
        cluster_tick=ClusterTick(s, channels, broker, reclaimer),
        counting_pool=pool,
        counting=counting,
        queue_watch=QueueWatch(s, channels, broker, guard, pool, counting),
        progress=ReceiveProgress(s, broker, pool, counting),
        routing=routing,
        reclassifier=reclassifier,
        pages=pages,
        dashboard=DashboardFeed(s.cluster, s.namespace, s.worker_id, broker, monitors.handlers),
        rejects=Rejects(s.cluster, s.namespace, f"worker {s.worker_id}"),
    )
    guard.on_refused = channels.on_refused = worker.refuse
    register(worker)
    return app, worker


def register(worker: Worker) -> None:
    """The worker's agents, timers, start task and pages, on its Faust app (which needs them
    before it starts)."""
    app, s, guard, channels = worker.app, worker.settings, worker.guard, worker.channels

    @app.agent(channels.monitor_events)
    async def monitor_agent(stream: Any) -> None:
        async for ev in stream.events():
            try:  # anyone who may write the topic may write anything: such a record is set aside
                queue = text_key(ev.key)
                event, source = codec.decode(ev.value)
            except Rejected as exc:
                worker.rejects.reject(consumed(ev.message), exc.reason)
                continue
            # Every event is stepped (no back-off): skipping one would lose it.
            await guard.run("monitor", functools.partial(worker.monitors.on_event, queue, event, source), backoff=False)

    @app.agent(channels.ticks)
    async def tick_agent(stream: Any) -> None:
        async for ev in stream.events():
            try:
                request = codec.decode_tick_request(ev.value)
            except Rejected as exc:
                worker.rejects.reject(consumed(ev.message), exc.reason)
                continue
            await guard.run("tick", functools.partial(worker.cluster_tick.on_request, *request), backoff=False)

    async def tick_timer() -> None:
        await worker.on_tick_timer()

    async def progress_timer() -> None:
        await guard.run("receive progress", worker.publish_progress)

    async def watch_timer() -> None:
        await guard.run("queue watcher", worker.queue_watch.once)  # a slow coordinator must not stop the worker

    worker.pages.register(app)

    async def on_start() -> None:
        await worker.start()

    # Faust's decorators are untyped: called, not applied, so the functions keep their types.
    app.timer(s.tick_interval)(tick_timer)
    app.timer(PROGRESS_INTERVAL, on_leader=True)(progress_timer)
    app.timer(s.watch_interval, on_leader=True)(watch_timer)
    app.task(on_start)

    add_dashboard(app, worker.dashboard)  # /dashboard: live charts of the queues (worker/web/dashboard.py)


def consumed(message: Any) -> Consumed:
    """A Faust message as the record core/rejected.py describes."""
    headers = message.headers
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    return Consumed(
        message.topic,
        message.partition,
        message.offset,
        message.key,
        message.value,
        [(str(k), v if isinstance(v, bytes) else str(v).encode()) for k, v in pairs],
    )


def shutdown(worker: Worker) -> None:
    worker.close()


def run_worker(s: WorkerSettings, loglevel: str = "info") -> None:
    """Run until SIGINT/SIGTERM."""
    # Activated readers wait on Kafka round trips, then for the GIL, which the event loop and the
    # other readers hold for up to the switch interval (5 ms by default) at a time.
    sys.setswitchinterval(0.001)
    app, worker = build_app(s)
    faust_worker = faust.Worker(
        app,
        loglevel=loglevel,
        quiet=True,
        override_logging=True,
        logging_config=json_logging_config(s, loglevel) if s.log_format == "json" else None,
    )
    code = 0
    try:
        faust_worker.execute_from_commandline()
    except SystemExit as exc:  # how mode's worker ends: 0, or 1 after a crash
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        crashed = worker.refused or app.crash_reason
        if worker.refused is None and crashed is not None and is_refusal(crashed):
            worker.refuse(crashed)  # one of Faust's own clients was refused: say so in one line
        shutdown(worker)
        if worker.refused is not None:
            sys.stderr.write(f"kbroker: error: {worker.refused}\n")
            code = code or 1
        os._exit(code)  # task handler threads may still sit in user code
