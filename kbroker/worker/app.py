"""The worker: a Faust app that runs queue monitors, activated readers, the cluster tick and the
timer service of one namespace. Thin: the decisions are in monitor.py and tick.py.

    monitor-events topic (4 partitions, key = queue) --> `monitors` agent --> monitor table
        step(state, event, now) -> LaunchReader (task handlers) | NotifyExternal (events topic)
    leader timer (0.5 s): QueueWatcher counts -> MessagesReady, and a RECEIVE seen by its commit
    every worker's tick timer -> ticks topic (1 partition) --> `ticks` agent: claim() runs each
        tick number once per cluster -> Tick to every monitor, TICK event on the events topic;
        every 5th tick: reclaim_namespace deletes queue records no reader needs
    activated readers' RECEIVEs (Broker hooks) -> ReceiveIssued / ReceiveReturned / Rollback

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
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import faust
import orjson

from kbroker.core import monitor_codec as codec
from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.log_limit import RateLimitFilter
from kbroker.core.monitor import (
    LaunchReader,
    MessagesReady,
    MonitorConfig,
    MonitorState,
    NotifyExternal,
    QueueAltered,
    ReaderExited,
    ReceiveIssued,
    ReceiveReturned,
    Rollback,
    Tick,
    new_monitor,
    recycle,
    step,
)
from kbroker.core.endpoint import CLOSED_GRACE_SECONDS
from kbroker.core.tick import EVERY_5TH, TickOwner, TickSchedule, claim
from kbroker.kafka.analytics_io import ControlReader, ProgressPublisher
from kbroker.kafka.clients import KAFKA_LOG_LIMIT, faust_broker
from kbroker.kafka.endpoint_store import EndpointStore
from kbroker.kafka.queues import conversation_rows
from kbroker.kafka.reclaim import reclaim_endpoints, reclaim_namespace
from kbroker.kafka.dispatcher import Dispatcher
from kbroker.kafka.timer_service import TimerService
from kbroker.kafka.transmitter import Transmitter
from kbroker.kafka.topics import create_missing_topics
from kbroker.kafka.watch import QueueCounts, QueueWatcher
from kbroker.sdk.broker import Broker
from kbroker.sdk.hooks import ReceiveHooks
from kbroker.worker.dashboard import add_dashboard
from kbroker.worker.guard import Guard
from kbroker.worker.handlers import OWN_PROCEDURE_MODULES, Task, TaskHandlers, allowed
from kbroker.worker.tables import WorkerTable

log = logging.getLogger("kbroker.worker")

MONITOR_PARTITIONS = 4
# Seconds between receive progress snapshots (docs/analytics.md): also the analytics job's clock,
# so a message crossing its stale threshold is seen within this plus a trigger or two.
PROGRESS_INTERVAL = 0.5
RECLASSIFIED_KEPT = 10000  # dialogs /dialogs/ remembers, the most recently told first
ENDPOINT_RECLAIM_SECONDS = 300.0  # the endpoint scan of the 5th-tick cleanup runs at most this often

# Every line the worker process writes passes this filter (installed on the root logger's handlers
# once Faust has set them up): aiokafka and Faust report each failed connection attempt while a
# broker is down, so repeats are held back and summarised once per window. librdkafka's lines are
# limited on their own logger already (kafka/clients.py).
LOG_LIMIT = RateLimitFilter(always=("aiokafka",))


def install_log_limit() -> None:
    """Put LOG_LIMIT on every handler of the root logger that lacks it (Faust replaces them)."""
    for handler in logging.getLogger().handlers:
        if LOG_LIMIT not in handler.filters:
            handler.addFilter(LOG_LIMIT)


def write_log_summaries() -> None:
    """Once a tick: the counts of repeated lines held back in windows that have ended."""
    LOG_LIMIT.write_summaries(log)
    KAFKA_LOG_LIMIT.write_summaries(log)


@dataclass
class WorkerSettings:
    cluster: Cluster  # a bootstrap string is taken as a cluster with no further settings
    namespace: str
    web_port: int = 6066
    web_host: str = "127.0.0.1"
    tick_interval: float = 5.0  # seed 000: the broker's periodic tick
    watch_interval: float = 0.25  # a first message launches a reader within about this long
    ramp_up: float = 5.0  # seed 003: seconds of non-empty RECEIVEs before one more reader
    handlers: int | None = None  # task handler threads; default 2 x CPUs
    timers: bool = True  # run the timer service (dialog timers, lifetimes)
    routing: bool = True  # run the dispatcher and the transmitter (messages between namespaces)
    # Modules whose activation procedures this worker runs, besides kbroker's own.
    allow_procedures: tuple[str, ...] = ()
    closed_grace: float = CLOSED_GRACE_SECONDS  # how long a CLOSED endpoint stays before its tombstone
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.cluster = Cluster.of(self.cluster)


def ensure_topics(s: WorkerSettings) -> None:
    """The worker's own topics. Faust declares its internal ones (changelogs, leader)."""
    want = {names.monitor_events_topic(s.namespace): MONITOR_PARTITIONS, names.ticks_topic(s.namespace): 1}
    create_missing_topics(s.cluster, want, {"retention.ms": str(24 * 3600 * 1000)}, replication_factor=1)


class MonitorHooks(ReceiveHooks):
    """Broker hooks of the worker's activated readers: their RECEIVEs reach the monitors.

    Sampled, not every one: a busy reader RECEIVEs dozens of times a second and each event is a
    Kafka record and a table update. A RECEIVE is reported (Issued, then Returned) when none of
    the queue was in the last `interval`; one that comes back empty is always reported, since
    that is what stops the ramp-up. Rollbacks are always reported."""

    def __init__(self, post, interval: float = 0.5):
        self._post, self._interval = post, interval
        self._last: dict[str, float] = {}
        self._local = threading.local()

    def before_receive(self, queue: str) -> None:
        now = time.monotonic()
        self._local.sampled = now - self._last.get(queue, 0.0) >= self._interval
        if self._local.sampled:
            self._last[queue] = now
            self._post(queue, ReceiveIssued())

    def after_receive(self, queue: str, count: int) -> None:
        sampled = getattr(self._local, "sampled", False)
        if count == 0 and not sampled:
            self._post(queue, ReceiveIssued())
            sampled = True
        if sampled:
            self._post(queue, ReceiveReturned(empty=count == 0))
        self._local.sampled = False

    def after_rollback(self, queue: str) -> None:
        self._post(queue, Rollback())


def build_app(s: WorkerSettings) -> tuple[faust.App, dict[str, Any]]:
    """The Faust app, and the runtime objects tests and the CLI look at."""
    ensure_topics(s)
    rt_dir = tempfile.TemporaryDirectory(prefix="kbroker-worker-")  # Faust's datadir; memory store
    app = faust.App(
        names.worker_app_id(s.namespace), broker=faust_broker(s.cluster), store="memory://",
        web_port=s.web_port, web_bind=s.web_host, web_host=s.web_host,
        datadir=rt_dir.name, topic_partitions=MONITOR_PARTITIONS,
        topic_replication_factor=1, table_standby_replicas=0, broker_session_timeout=10,
        broker_heartbeat_interval=2, consumer_auto_offset_reset="earliest", Table=WorkerTable,
    )
    monitor_topic = app.topic(names.monitor_events_topic(s.namespace), key_serializer="raw",
                              value_serializer="raw", partitions=MONITOR_PARTITIONS)
    ticks_topic = app.topic(names.ticks_topic(s.namespace), key_serializer="raw", value_serializer="raw",
                            partitions=1)
    events_topic = app.topic(names.events_topic(s.namespace), key_serializer="raw", value_serializer="raw")
    monitors = app.Table("monitors", default=None, partitions=MONITOR_PARTITIONS)
    tick_owner = app.Table("tick-owner", default=None, partitions=1)
    schedule = TickSchedule(interval=s.tick_interval)
    guard = Guard(log)
    rt: dict[str, Any] = {"datadir": rt_dir, "watchers": {}, "configs": {}, "guard": guard}

    def post(queue: str, event: Any) -> None:
        """From a reader's thread: put a monitor event on the topic (fire and forget)."""
        loop = rt.get("loop")
        if loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(
                monitor_topic.send(key=queue.encode(), value=codec.encode(event, s.worker_id)), loop)

    def on_exit(task: Task, ok: bool) -> None:
        post(task.queue, ReaderExited(generation=task.generation))

    broker = Broker(s.cluster, s.namespace)
    broker.hooks.append(MonitorHooks(post))
    handlers = TaskHandlers(broker, on_exit, size=s.handlers, worker_id=s.worker_id, guard=guard)
    # sys.conversation_endpoints kept in memory (read-only, sequences as written): after the
    # first read, /conversations/ reads only what changed since, whatever the topic holds.
    conversations = EndpointStore(s.cluster, s.namespace, None, continue_sequences=False)
    rt.update(app=app, broker=broker, handlers=handlers, conversations=conversations)

    allowed_modules = OWN_PROCEDURE_MODULES + tuple(s.allow_procedures)
    refused: set[tuple[str, str]] = set()  # (queue, procedure) already reported

    def config_of(queue: str) -> MonitorConfig:
        try:
            config = MonitorConfig.from_queue(broker.catalog.queue(queue), ramp_up=s.ramp_up)
        except Exception:
            return MonitorConfig(enabled=False, ramp_up=s.ramp_up)
        if config.enabled and config.internal and config.procedure and \
                not allowed(config.procedure, allowed_modules):
            refuse(queue, config.procedure)
            return MonitorConfig(enabled=False, ramp_up=s.ramp_up)  # not activated
        return config

    def refuse(queue: str, procedure: str) -> None:
        """Once per queue and procedure: a log line and an ACTIVATION_REFUSED event naming it."""
        if (queue, procedure) in refused:
            return
        refused.add((queue, procedure))
        log.error("activation of queue %s refused: procedure %s is not in a module this worker allows %s "
                  "(kbroker worker --allow-procedures MODULE)", queue, procedure, list(allowed_modules))
        event = {"event": "ACTIVATION_REFUSED", "queue": queue, "namespace": s.namespace, "procedure": procedure,
                 "allowed": list(allowed_modules), "time": int(time.time() * 1000)}
        asyncio.get_running_loop().create_task(events_topic.send(key=queue.encode(), value=orjson.dumps(event)))

    async def perform(actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, LaunchReader):
                handlers.launch(a.queue, a.procedure or "", a.generation)
                log.info("launch reader queue=%s generation=%s procedure=%s", a.queue, a.generation, a.procedure)
            elif isinstance(a, NotifyExternal):
                event = {"event": "QUEUE_ACTIVATION", "queue": a.queue, "namespace": s.namespace,
                         "backlog": a.backlog, "ready_groups": a.ready_groups, "time": int(time.time() * 1000)}
                await events_topic.send(key=a.queue.encode(), value=orjson.dumps(event))

    @app.agent(monitor_topic)
    async def monitor_agent(stream):
        async for key, raw in stream.items():
            queue = key.decode()
            try:
                event, source = codec.decode(raw)
            except codec.BadEvent as exc:
                log.warning("%s", exc)
                continue
            # Every event is stepped (no back-off): skipping one would lose it.
            await guard.run("monitor", functools.partial(on_monitor_event, queue, event, source), backoff=False)

    async def on_monitor_event(queue: str, event: Any, source: str | None) -> None:
        """One monitor event: step the queue's monitor, store it, carry out its actions."""
        if isinstance(event, QueueAltered):  # the ramp-up pace is this worker's setting
            event = QueueAltered(replace(event.config, ramp_up=s.ramp_up))
        now = time.time()
        stored = monitors.get(queue)
        actions: list[Any] = []
        if stored is None:
            state = new_monitor(queue, config_of(queue))
        else:
            state = MonitorState.from_dict(stored)
            if stored.get("owner") != s.worker_id:  # taken over: its readers are not ours
                state, actions = recycle(state, config_of(queue), now)
        # An event of the previous owner's readers (replayed after a take-over) is skipped:
        # they died with that worker or finish on their own, and must not count as waiting here.
        if source in (None, s.worker_id):
            state, more = step(state, event, now)
            actions += more
        log.debug("monitor queue=%s event=%s state=%s readers=%s", queue, event, state.state.value, state.readers)
        # `counted`: when the counts (backlog, ready groups) were last measured; the view's as_of.
        counted = now if isinstance(event, MessagesReady) else (stored or {}).get("counted", now)
        monitors[queue] = {**state.to_dict(), "owner": s.worker_id, "updated": now, "counted": counted,
                           "health": guard.health.snapshot(queue)}  # the worker's reasons and this queue's
        await perform(actions)

    @app.agent(ticks_topic)
    async def tick_agent(stream):
        async for raw in stream:
            await guard.run("tick", functools.partial(on_tick_request, raw), backoff=False)

    async def on_tick_request(raw: bytes) -> None:
        """A worker asked for a tick: run it if this tick number is due and unclaimed."""
        req = orjson.loads(raw)
        run, owner = claim(TickOwner.from_dict(tick_owner.get("owner")), req["worker"], req["now"], schedule)
        tick_owner["owner"] = owner.to_dict()
        if run is None:
            return
        queues = await asyncio.to_thread(
            lambda: [q.name for q in broker.catalog.queues.values() if q.activation is not None])
        for queue in queues:
            await monitor_topic.send(key=queue.encode(), value=codec.encode(Tick()))
        event = {"event": "TICK", "number": run.number, "due": sorted(run.due), "missed": run.missed,
                 "worker": req["worker"], "time": int(time.time() * 1000)}
        await events_topic.send(key=b"tick", value=orjson.dumps(event))
        if EVERY_5TH in run.due:
            start_reclaim()

    def start_reclaim() -> None:
        # Off the tick agent: reading a retained queue's prefix may take a while.
        if not rt.get("reclaiming"):
            rt["reclaiming"] = asyncio.ensure_future(guard.run("reclaim", reclaim_records))

    async def reclaim_records() -> None:
        """Seed 000's 5th-tick cleanup, once per cluster: records no queue reader needs are
        deleted; endpoints closed for longer than the grace period are tombstoned (a scan of the
        endpoints topic, so at most every ENDPOINT_RECLAIM_SECONDS, or every closed_grace when shorter)."""
        try:
            done = await asyncio.to_thread(lambda: reclaim_namespace(s.cluster, broker.catalog))
            every = min(ENDPOINT_RECLAIM_SECONDS, s.closed_grace)  # a short grace is reclaimed as often
            if time.monotonic() - rt.get("endpoints_reclaimed", -every) >= every:
                rt["endpoints_reclaimed"] = time.monotonic()
                n = await asyncio.to_thread(reclaim_endpoints, s.cluster, s.namespace, s.closed_grace)
                if n:
                    log.info("reclaimed endpoints=%d closed_for_more_than=%ss", n, s.closed_grace)
        finally:
            rt["reclaiming"] = None
        for r in done:
            log.info("reclaimed topic=%s deleted_below=%s", r.topic, r.deleted_below)
            event = {"event": "RECORDS_RECLAIMED", "topic": r.topic, "time": int(time.time() * 1000),
                     "deleted_below": {str(p): o for p, o in r.deleted_below.items()}}  # JSON keys
            await events_topic.send(key=r.topic.encode(), value=orjson.dumps(event))

    async def request_tick() -> None:
        # Every worker asks; the tick agent runs each tick number once per cluster.
        await ticks_topic.send(key=b"tick", value=orjson.dumps({"worker": s.worker_id, "now": time.time()}))

    async def restart_handlers() -> None:
        handlers.restart_dead()  # a per-worker every-tick task

    async def refresh_catalog() -> None:
        await asyncio.to_thread(broker.refresh_catalog)  # ALTER QUEUE from any process reaches the monitors

    @app.timer(s.tick_interval)
    async def tick_timer():
        # Each part on its own: a broker that is down fails the catalog refresh, which must
        # neither stop the worker nor keep the handler threads from being replaced.
        install_log_limit()
        await guard.run("tick request", request_tick)
        await guard.run("task handlers", restart_handlers)
        await guard.run("catalog refresh", refresh_catalog)
        await guard.run("timer service", ensure_timer_service)
        await guard.run("routing", ensure_routing)
        await guard.run("reclassification", every_2nd_tick)
        if guard.health.failing("reclaim") and guard.due("reclaim"):
            # This worker's 5th-tick cleanup failed (a coordinator still loading after a broker
            # restart): tried again with back-off from here, not at the next 5th tick, which
            # waits for the tick agent's consumer group to settle and so kept the worker
            # degraded long after Kafka answered again.
            start_reclaim()
        write_log_summaries()

    reclassified: dict[str, dict[str, Any]] = {}  # dialog -> its last RECLASSIFY
    rt["reclassified"] = reclassified
    ticks_seen = {"n": 0}

    def read_control() -> None:
        """The transmitter's 2nd-tick reclassification, the part that exists before routing: the
        RECLASSIFY commands of the analytics job, recorded (a command repeated by a batch the job
        ran again has the same key and batch) and logged once each."""
        reader = rt.get("control")
        if reader is None:
            reader = rt["control"] = ControlReader(s.cluster, s.namespace)
        for key, cmd in reader.read(timeout=min(2.0, s.tick_interval / 2)):
            if cmd.get("command") != "RECLASSIFY":
                continue
            old = reclassified.get(key)
            if old is not None and old.get("batch") == cmd.get("batch") and old.get("to") == cmd.get("to"):
                continue
            reclassified.pop(key, None)
            reclassified[key] = {**cmd, "received": time.time()}
            while len(reclassified) > RECLASSIFIED_KEPT:
                del reclassified[next(iter(reclassified))]
            log.info("dialog reclassified dialog=%s queue=%s from=%s to=%s", key, cmd.get("queue"),
                     cmd.get("from"), cmd.get("to"))
            if rt.get("transmitter") is not None:  # waiting messages are looked at again
                rt["transmitter"].request_reclassify(f"RECLASSIFY of dialog {key}")

    async def every_2nd_tick() -> None:
        ticks_seen["n"] += 1
        if ticks_seen["n"] % 2 == 0:
            await asyncio.to_thread(read_control)

    def publish_progress() -> None:
        """Every queue group's committed offsets, for the analytics job (docs/analytics.md)."""
        publisher = rt.get("progress")
        if publisher is None:
            publisher = rt["progress"] = ProgressPublisher(s.cluster, s.namespace)
        queues = list(broker.catalog.queues)
        snaps = [snap for snap in counting_pool.map(lambda q: publisher.snapshot(q, timeout=2.0), queues) if snap]
        publisher.publish(snaps, timeout=2.0)

    @app.timer(PROGRESS_INTERVAL, on_leader=True)
    async def progress_timer():
        await guard.run("receive progress", lambda: asyncio.to_thread(publish_progress))

    async def watch_once() -> None:
        pending = await asyncio.to_thread(watch_queues)
        for queue, event in pending:
            await monitor_topic.send(key=queue.encode(), value=codec.encode(event))

    @app.timer(s.watch_interval, on_leader=True)
    async def watch_timer():
        await guard.run("queue watcher", watch_once)  # a slow coordinator must not stop the worker

    seen: dict[str, QueueCounts] = {}  # each watched queue's counts at the last pass
    counting_pool = rt["counting_pool"] = ThreadPoolExecutor(8, thread_name_prefix="kbroker-count")
    counted_at: dict[str, float] = {}  # when each queue's counts were last sent to its monitor

    def count(name: str) -> QueueCounts | Exception:
        try:
            watcher = rt["watchers"].get(name)
            if watcher is None:
                watcher = rt["watchers"][name] = QueueWatcher(s.cluster, s.namespace, name)
            # Bounded by half a tick: a coordinator slow to answer (busy with the readers'
            # commits) held the counts, and the view, for the whole 5 s it used to wait.
            return watcher.counts(timeout=min(5.0, max(0.5, s.tick_interval / 2)))
        except Exception as exc:  # noqa: BLE001 - reported per queue below
            return exc

    def watch_queues() -> list[tuple[str, Any]]:
        """On the leader: the monitor events that the queues' configs and counts call for."""
        pending: list[tuple[str, Any]] = []
        watched = []
        for q in broker.catalog.queues.values():
            cfg = MonitorConfig.from_queue(q, ramp_up=s.ramp_up)
            old = rt["configs"].get(q.name)
            if old is None and q.activation is None:
                continue  # no activation clause: no monitor, so no row to count for
            # A queue whose activation is OFF is counted too: its monitor row (ticked like every
            # queue with an activation clause) shows what waits in it (README, "The worker stays up").
            if old is not None and old != cfg:
                pending.append((q.name, QueueAltered(cfg)))
            rt["configs"][q.name] = cfg
            watched.append(q.name)
        # Each queue is counted by its own watcher (its own consumer), all at once: a pass takes
        # as long as the slowest count, not their sum (one after the other, a pass over five
        # queues whose counts each ran into their 0.5 s bound took 2.5 s, and every row aged by
        # as much).
        for name, counts in zip(watched, counting_pool.map(count, watched)):
            if isinstance(counts, Exception):
                guard.failed(f"counting queue {name}", counts, queue=name)
                continue
            guard.succeeded(f"counting queue {name}")
            last = seen.get(name)
            now = time.monotonic()
            # Sent when the counts change, and at least twice a tick when they do not: a count
            # that did not reach the monitor (a send lost in a rebalance or an outage) is put
            # right within half a tick instead of standing until the queue changes again, and
            # the view's rows stay well inside two ticks old on a loaded machine.
            if last is None or (counts.backlog, counts.ready_groups) != (last.backlog, last.ready_groups) \
                    or now - counted_at.get(name, 0.0) >= s.tick_interval / 2:
                pending.append((name, MessagesReady(counts.backlog, counts.ready_groups)))
                counted_at[name] = now
            if last is not None and counts.received > last.received:
                # Some RECEIVE committed (from any process): what moves NOTIFIED on.
                pending += [(name, ReceiveIssued()), (name, ReceiveReturned(empty=False))]
            seen[name] = counts
        return pending

    @app.page("/monitors/")
    async def monitors_page(web, request):
        from kbroker.worker.views import monitor_rows

        return web.json(await asyncio.to_thread(monitor_rows, s.cluster, s.namespace))

    @app.page("/conversations/")
    async def conversations_page(web, request):
        rows = await asyncio.to_thread(lambda: conversation_rows(conversations.all()))
        return web.json({"namespace": s.namespace, "worker": s.worker_id, "rows": rows, "as_of": time.time()})

    @app.page("/dialogs/")
    async def dialogs_page(web, request):
        rows = sorted(reclassified.values(), key=lambda r: (r.get("queue") or "", r["conversation_id"], r["side"]))
        return web.json({"namespace": s.namespace, "worker": s.worker_id, "rows": rows, "as_of": time.time()})

    @app.page("/tasks/")
    async def tasks_page(web, request):
        return web.json({"worker": s.worker_id, "handlers": handlers.size, "waiting": handlers.waiting(),
                         "tasks": handlers.rows(), **guard.health.snapshot(), "as_of": time.time()})

    async def ensure_timer_service() -> None:
        """Start the timer service if it is not running (it cannot start while the broker is down)."""
        if s.timers and rt.get("timer_service") is None:
            rt["timer_service"] = await asyncio.to_thread(
                lambda: TimerService(s.cluster, s.namespace, endpoints=broker.endpoints,
                                     guard=guard).start())

    async def ensure_routing() -> None:
        """Start the dispatcher and the transmitter (routing between namespaces) if they are not
        running; like the timer service they cannot start while the broker is down."""
        if not s.routing:
            return
        if rt.get("dispatcher") is None:
            rt["dispatcher"] = await asyncio.to_thread(
                lambda: Dispatcher(s.cluster, s.namespace, lambda: broker.catalog, guard=guard,
                                   tick=s.tick_interval).start())
        if rt.get("transmitter") is None:
            rt["transmitter"] = await asyncio.to_thread(
                lambda: Transmitter(s.cluster, s.namespace, lambda: broker.catalog, guard=guard,
                                    tick=s.tick_interval).start())

    @app.task
    async def on_start():
        rt["loop"] = asyncio.get_running_loop()
        install_log_limit()
        await guard.run("timer service", ensure_timer_service)
        await guard.run("routing", ensure_routing)
        asyncio.get_running_loop().run_in_executor(None, warm_conversations)
        log.info("worker started worker=%s namespace=%s", s.worker_id, s.namespace)

    def warm_conversations() -> None:
        """The first read of the endpoints topic, before anyone asks for the view."""
        try:
            conversations.all()
        except Exception as exc:  # the page reads again when asked
            log.warning("reading the conversation endpoints failed (%s); /conversations/ reads when asked", exc)

    add_dashboard(app, s, rt)  # /dashboard: live charts of the queues (worker/dashboard.py)
    return app, rt


def shutdown(rt: dict[str, Any]) -> None:
    if rt.get("dashboard") is not None:
        rt["dashboard"].close()
    for name in ("timer_service", "transmitter", "dispatcher"):
        if rt.get(name) is not None:
            rt[name].close()
    rt["handlers"].close(timeout=5)
    rt["counting_pool"].shutdown(wait=True)
    for name in ("progress", "control"):
        if rt.get(name) is not None:
            rt[name].close()
    for w in rt["watchers"].values():
        w.close()
    rt["broker"].close()
    rt["conversations"].close()
    rt["datadir"].cleanup()


def run_worker(s: WorkerSettings, loglevel: str = "info") -> None:
    """Run until SIGINT/SIGTERM."""
    # Activated readers wait on Kafka round trips, then for the GIL, which the event loop and the
    # other readers hold for up to the switch interval (5 ms by default) at a time.
    sys.setswitchinterval(0.001)
    app, rt = build_app(s)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, override_logging=True)
    try:
        worker.execute_from_commandline()
    finally:
        shutdown(rt)
        os._exit(0)  # task handler threads may still sit in user code
