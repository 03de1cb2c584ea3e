"""The worker's per-worker background services and the analytics job's commands to it:

Routing: the timer service (dialog timers, lifetimes), the dispatcher and the transmitter
    (messages between namespaces), started when they can be (not while the broker is down)
Reclassifier: the RECLASSIFY commands of the analytics job, read every 2nd tick (the part of
    the transmitter's 2nd-tick reclassification that exists before routing)
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kbroker.kafka.analytics.results import ControlReader
from kbroker.kafka.dialogs.timer_service import TimerService
from kbroker.kafka.routing.dispatcher import Dispatcher
from kbroker.kafka.routing.transmitter import Transmitter
from kbroker.sdk.broker import Broker
from kbroker.worker.guard import Guard
from kbroker.worker.settings import WorkerSettings

log = logging.getLogger("kbroker.worker")

RECLASSIFIED_KEPT = 10000  # dialogs /dialogs/ remembers, the most recently told first


class Routing:
    """The timer service, the dispatcher and the transmitter of this worker. Their starts block
    (the worker runs them on a thread) and fail while the broker is down, so each start_* starts
    what is not running yet and is called again every tick; close() closes what runs."""

    def __init__(self, s: WorkerSettings, broker: Broker, guard: Guard):
        self.s, self.broker, self.guard = s, broker, guard
        self.timer_service: TimerService | None = None
        self.dispatcher: Dispatcher | None = None
        self.transmitter: Transmitter | None = None

    def start_timer_service(self) -> None:
        if self.s.timers and self.timer_service is None:
            self.timer_service = TimerService(
                self.s.cluster, self.s.namespace, endpoints=self.broker.endpoints, guard=self.guard
            ).start()

    def start_routing(self) -> None:
        if not self.s.routing:
            return
        catalog = lambda: self.broker.catalog  # noqa: E731 - read at each use: the catalog is replaced
        if self.dispatcher is None:
            self.dispatcher = Dispatcher(
                self.s.cluster, self.s.namespace, catalog, guard=self.guard, tick=self.s.tick_interval
            ).start()
        if self.transmitter is None:
            self.transmitter = Transmitter(
                self.s.cluster, self.s.namespace, catalog, guard=self.guard, tick=self.s.tick_interval
            ).start()

    def close(self) -> None:
        for service in (self.timer_service, self.transmitter, self.dispatcher):
            if service is not None:
                service.close()


class Reclassifier:
    """The RECLASSIFY commands of the analytics job, recorded (a command repeated by a batch the
    job ran again has the same key and batch) and logged once each; /dialogs/ shows them.
    close() closes the control topic's reader."""

    def __init__(self, s: WorkerSettings, routing: Routing):
        self.s, self.routing = s, routing
        self.reader: ControlReader | None = None
        self.reclassified: dict[str, dict[str, Any]] = {}  # dialog -> its last RECLASSIFY

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def read(self) -> None:
        reader = self.reader
        if reader is None:
            reader = self.reader = ControlReader(self.s.cluster, self.s.namespace)
        reclassified = self.reclassified
        for key, cmd in reader.read(timeout=min(2.0, self.s.tick_interval / 2)):
            if cmd.get("command") != "RECLASSIFY":
                continue
            old = reclassified.get(key)
            if old is not None and old.get("batch") == cmd.get("batch") and old.get("to") == cmd.get("to"):
                continue
            reclassified.pop(key, None)
            reclassified[key] = {**cmd, "received": time.time()}
            while len(reclassified) > RECLASSIFIED_KEPT:
                del reclassified[next(iter(reclassified))]
            log.info(
                "dialog reclassified dialog=%s queue=%s from=%s to=%s",
                key,
                cmd.get("queue"),
                cmd.get("from"),
                cmd.get("to"),
            )
            transmitter = self.routing.transmitter
            if transmitter is not None:  # waiting messages are looked at again
                transmitter.request_reclassify(f"RECLASSIFY of dialog {key}")
