"""The queue monitors' service: each monitor event (from the queue watch, the cluster tick and the
activated readers' RECEIVEs) steps its queue's monitor (core/activation/monitor.py), whose state lives in a
Faust table, and the actions it returns launch readers on the task handlers or tell external
activators. Also the readers' side: their hooks and exits become monitor events.

A monitor lives in whichever worker owns its partition; when that worker dies another restores
it from the changelog and recycles it (its readers died with the old worker)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Self

from kbroker import metrics
from kbroker.core.activation import monitor_codec as codec
from kbroker.core.activation.monitor import (
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
    new_monitor,
    recycle,
    step,
)
from kbroker.errors import KBrokerError
from kbroker.sdk.broker import Broker
from kbroker.sdk.hooks import ReceiveHooks
from kbroker.worker.activation.handlers import OWN_PROCEDURE_MODULES, Task, TaskHandlers, refusal
from kbroker.worker.guard import Guard
from kbroker.worker.settings import Channels, WorkerSettings, now_ms

log = logging.getLogger("kbroker.worker")


class MonitorHooks(ReceiveHooks):
    """Broker hooks of the worker's activated readers: their RECEIVEs reach the monitors.

    Sampled, not every one: a busy reader RECEIVEs dozens of times a second and each event is a
    Kafka record and a table update. A RECEIVE is reported (Issued, then Returned) when none of
    the queue was in the last `interval`; one that comes back empty is always reported, since
    that is what stops the ramp-up. Rollbacks are always reported."""

    def __init__(self, post: Callable[[str, Any], None], interval: float = 0.5):
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


class Monitors:
    """The monitor agent's work and the task handlers that run the readers it launches. start()
    (on the event loop) lets the readers' threads post events; close() stops the handlers."""

    def __init__(self, s: WorkerSettings, channels: Channels, broker: Broker, guard: Guard):
        self.s, self.channels, self.broker, self.guard = s, channels, broker, guard
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start(): readers post through it
        self.allowed_modules = OWN_PROCEDURE_MODULES + tuple(s.allow_procedures)
        self._refused: set[tuple[str, str]] = set()  # (queue, procedure) already reported
        broker.hooks.append(MonitorHooks(self.post))
        self.handlers = TaskHandlers(
            broker, self._on_exit, size=s.handlers, worker_id=s.worker_id, guard=guard, modules=self.allowed_modules
        )

    def start(self) -> Self:
        self.loop = asyncio.get_running_loop()
        return self

    def close(self) -> None:
        self.handlers.close(timeout=5)

    def post(self, queue: str, event: Any) -> None:
        """From a reader's thread: put a monitor event on the topic (fire and forget)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.send(queue, codec.encode(event, self.s.worker_id)), loop)

    async def send(self, queue: str, encoded: bytes) -> None:
        await self.channels.send(self.channels.monitor_events, queue.encode(), encoded)

    def _on_exit(self, task: Task, ok: bool) -> None:
        self.post(task.queue, ReaderExited(generation=task.generation))

    def config_of(self, queue: str) -> MonitorConfig:
        ramp_up = self.s.ramp_up
        try:
            config = MonitorConfig.from_queue(self.broker.catalog.queue(queue), ramp_up=ramp_up)
        except KBrokerError:  # a queue the catalog does not name (or a catalog not readable): not activated
            return MonitorConfig(enabled=False, ramp_up=ramp_up)
        return self.checked(queue, config)

    def checked(self, queue: str, config: MonitorConfig) -> MonitorConfig:
        """The config a monitor may run with, whichever path chose it (the catalog at a monitor's
        creation or take-over, a QueueAltered event that anyone who can write the monitor-events
        topic may have written): with a procedure this worker does not allow, the queue is not
        activated (refused, said once), rather than keeping an earlier procedure the queue no
        longer names: one rule for every path, and the catalog stays what decides."""
        why = refusal(config.procedure or "", self.allowed_modules) if config.enabled and config.internal else None
        if why is not None:
            self._refuse(queue, config.procedure or "", why)
            return MonitorConfig(enabled=False, ramp_up=config.ramp_up)  # not activated
        return config

    def _refuse(self, queue: str, procedure: str, why: str) -> None:
        """Once per queue and procedure: a log line and an ACTIVATION_REFUSED event saying why."""
        if (queue, procedure) in self._refused:
            return
        self._refused.add((queue, procedure))
        modules = list(self.allowed_modules)
        log.error(
            "activation of queue %s refused: %s (allowed modules %s; kbroker worker --allow-procedures MODULE)",
            queue,
            why,
            modules,
        )
        event = {
            "event": "ACTIVATION_REFUSED",
            "queue": queue,
            "namespace": self.s.namespace,
            "procedure": procedure,
            "allowed": modules,
            "time": now_ms(),
            "reason": why,
        }
        asyncio.get_running_loop().create_task(self.channels.send_event(queue, event))

    async def _perform(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, LaunchReader):
                metrics.of(metrics.ACTIVATIONS, self.s.namespace, a.queue, "internal").inc()
                self.handlers.launch(a.queue, a.procedure or "", a.generation)
                log.info("launch reader queue=%s generation=%s procedure=%s", a.queue, a.generation, a.procedure)
            elif isinstance(a, NotifyExternal):
                metrics.of(metrics.ACTIVATIONS, self.s.namespace, a.queue, "external").inc()
                event = {
                    "event": "QUEUE_ACTIVATION",
                    "queue": a.queue,
                    "namespace": self.s.namespace,
                    "backlog": a.backlog,
                    "ready_groups": a.ready_groups,
                    "time": now_ms(),
                }
                await self.channels.send_event(a.queue, event)

    async def on_event(self, queue: str, event: Any, source: str | None) -> None:
        """One monitor event: step the queue's monitor, store it, carry out its actions."""
        s, table = self.s, self.channels.monitors
        if isinstance(event, QueueAltered):  # the ramp-up pace is this worker's setting
            event = QueueAltered(self.checked(queue, replace(event.config, ramp_up=s.ramp_up)))
        now = time.time()
        stored = table.get(queue)
        actions: list[Any] = []
        if stored is None:
            state = new_monitor(queue, self.config_of(queue))
        else:
            state = MonitorState.from_dict(stored)
            if stored.get("owner") != s.worker_id:  # taken over: its readers are not ours
                state, actions = recycle(state, self.config_of(queue), now)
        # An event of the previous owner's readers (replayed after a take-over) is skipped:
        # they died with that worker or finish on their own, and must not count as waiting here.
        if source in (None, s.worker_id):
            state, more = step(state, event, now)
            actions += more
        log.debug("monitor queue=%s event=%s state=%s readers=%s", queue, event, state.state.value, state.readers)
        # `counted`: when the counts (backlog, ready groups) were last measured; the view's as_of.
        counted = now if isinstance(event, MessagesReady) else (stored or {}).get("counted", now)
        table[queue] = {
            **state.to_dict(),
            "owner": s.worker_id,
            "updated": now,
            "counted": counted,
            "health": self.guard.health.snapshot(queue),
        }  # the worker's reasons and this queue's
        await self._perform(actions)
