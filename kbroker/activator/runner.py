"""The activator's adapter: Kafka in, child processes out. Decisions are `rules.Rules`'.

One loop, one thread: consume the namespace's events topic (group `kbroker.<ns>.activator`), feed
QUEUE_ACTIVATION notifications for configured queues to the rules, start children, reap them,
keep min_concurrency copies, commit. Every start and exit is a structured log record (a dict
handed to `log`; the CLI prints it as a JSON line or as text).

Several activators with the same config may run: they share the events topic's partitions (key =
queue, so one queue's notifications go to one of them), and each enforces max_concurrency on its
own children only.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from kbroker import metrics
from kbroker.activator.config import ActivatorConfig, Application
from kbroker.activator.notification import parse
from kbroker.activator.rules import NOTIFIED, Limits, Rules
from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.security.client_properties import env_of
from kbroker.errors import KBrokerError
from kbroker.kafka.activation.events import EventsReader

LOG = logging.getLogger("kbroker.activator")
EXIT_CANNOT_START = 127  # what a shell reports for a command it cannot run


def activator_group(namespace: str) -> str:
    return f"{names.prefix(namespace)}activator"


def _default_log(record: dict) -> None:
    LOG.info("%s", record)


@dataclass
class Child:
    app: Application
    proc: subprocess.Popen
    started: float
    reason: str


class Activator:
    def __init__(
        self,
        cfg: ActivatorConfig,
        cluster: ClusterLike,
        namespace: str,
        *,
        log: Callable[[dict], None] = _default_log,
        poll_interval: float = 0.2,
        clock: Callable[[], float] = time.time,
        child_stdout: int | None = 2,
    ):
        self.cfg, self.cluster, self.namespace = cfg, Cluster.of(cluster), namespace
        self.apps = cfg.enabled()
        self.rules = Rules(
            {q: Limits(a.min_concurrency, a.max_concurrency) for q, a in self.apps.items()},
            namespace=namespace,
            stale_after=cfg.stale_after,
            restart_delay=cfg.restart_delay,
        )
        self.children: dict[str, list[Child]] = {q: [] for q in self.apps}
        self.topic = names.events_topic(namespace)
        self.group = activator_group(namespace)
        self.ready = threading.Event()  # set once partitions are assigned and positioned
        self._stop = threading.Event()
        self._log, self._poll, self._clock = log, poll_interval, clock
        # Children's stdout goes to our stderr by default: our stdout carries the JSON log lines.
        self._child_stdout = child_stdout

    # --- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask run() to return; safe from a signal handler or another thread."""
        self._stop.set()

    def running(self, queue: str) -> int:
        return len(self.children.get(queue, []))

    def run(self) -> None:
        """Blocks until stop(). Whatever happens, children are terminated before it returns."""
        events = EventsReader(
            self.cluster,
            self.namespace,
            self.group,
            on_ready=self.ready.set,
            on_error=lambda text: self._emit("kafka_error", error=text),
        )
        try:
            self._emit(
                "activator_started",
                group=self.group,
                topic=self.topic,
                applications=[a.label for a in self.apps.values()],
            )
            self._check_catalog()
            events.subscribe()
            while not self._stop.is_set():
                records = events.read(100, self._poll)
                self._reap()  # first, so a copy that just exited frees its slot
                for record in records:
                    self._on_record(record.key, record.value)
                self._tick()
                if records:
                    # After acting: a crash in between replays the notification, which at worst
                    # starts one copy too many, still capped by max_concurrency.
                    try:
                        events.commit()
                    except KBrokerError as exc:
                        self._emit("kafka_error", error=str(exc))
        finally:
            try:
                self._shutdown_children()
            finally:
                events.close()  # commits the last position first: a restart does not replay it
                self._emit("activator_stopped")

    # --- Kafka -------------------------------------------------------------------------------

    def _check_catalog(self) -> None:
        """Warn (not fail: the catalog may be applied later) when the worker will not notify."""
        from kbroker.kafka.catalog.catalog_store import read_catalog

        try:
            queues = read_catalog(self.cluster, self.namespace).queues
        except Exception as exc:  # noqa: BLE001 - only a warning: the catalog may be applied later
            self._emit("warning", message=f"cannot read the catalog: {exc}")
            return
        for q in self.apps:
            queue = queues.get(q)
            if queue is None:
                self._emit("warning", queue=q, message=f"queue {q!r} is not in the catalog of {self.namespace!r}")
            elif queue.activation is None or queue.activation.kind != "external" or queue.activation.status != "ON":
                self._emit(
                    "warning",
                    queue=q,
                    message="the queue has no external activation with STATUS = ON: the worker will not notify it",
                )

    # --- decisions ---------------------------------------------------------------------------

    def _on_record(self, key: bytes | None, value: bytes | None) -> None:
        n = parse(key, value)
        if n is None or n.queue not in self.apps:
            return  # other events, other queues
        running = self.running(n.queue)
        d = self.rules.on_notification(n, running, self._clock())
        self._emit(
            "notification",
            queue=n.queue,
            backlog=n.backlog,
            ready_groups=n.ready_groups,
            running=running,
            decision=d.reason,
        )
        for _ in range(d.start):
            self._start(self.apps[n.queue], NOTIFIED)

    def _tick(self) -> None:
        now = self._clock()
        for queue, app in self.apps.items():
            d = self.rules.on_tick(queue, self.running(queue), now)
            for _ in range(d.start):
                self._start(app, d.reason)

    # --- children ----------------------------------------------------------------------------

    def _start(self, app: Application, reason: str) -> None:
        # A child reaches the cluster as the activator does: its address and its client settings
        # (KBROKER_KAFKA_* variables, never arguments a process listing shows).
        env = {
            **os.environ,
            **app.env,
            **env_of(self.cluster.properties),
            "KBROKER_BOOTSTRAP": self.cluster.bootstrap,
            "KBROKER_NAMESPACE": self.namespace,
            "KBROKER_QUEUE": app.queue,
        }
        try:
            # A session of its own: Ctrl-C on the terminal reaches only the activator, which then
            # stops children in order; and signalling the group reaches a wrapper's children too.
            proc = subprocess.Popen(
                app.command,
                env=env,
                cwd=app.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._child_stdout,
                start_new_session=True,
            )
        except OSError as exc:
            self.rules.on_exit(app.queue, EXIT_CANNOT_START, self._clock())
            self._emit(
                "start_failed",
                queue=app.queue,
                application=app.label,
                reason=reason,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        self.children[app.queue].append(Child(app, proc, time.monotonic(), reason))
        self._emit(
            "start",
            queue=app.queue,
            application=app.label,
            pid=proc.pid,
            reason=reason,
            running=self.running(app.queue),
        )

    def _reap(self, stopping: bool = False) -> None:
        now = self._clock()
        for queue, kids in self.children.items():
            for child in [c for c in kids if c.proc.poll() is not None]:
                kids.remove(child)
                rc = child.proc.returncode
                if not stopping:
                    self.rules.on_exit(queue, rc, now)
                extra = {"signal": signal.Signals(-rc).name} if rc < 0 and -rc in signal.valid_signals() else {}
                self._emit(
                    "exit",
                    queue=queue,
                    application=child.app.label,
                    pid=child.proc.pid,
                    returncode=rc,
                    **extra,
                    ran_for=round(time.monotonic() - child.started, 3),
                    running=len(kids),
                )

    def _signal_all(self, sig: int) -> None:
        for kids in self.children.values():
            for child in kids:
                if child.proc.poll() is None:  # not reaped: its pid (= its group) is still ours
                    try:
                        os.killpg(child.proc.pid, sig)
                    except ProcessLookupError:
                        pass

    def _shutdown_children(self) -> None:
        if not any(self.children.values()):
            return
        self._emit(
            "stopping_children", count=sum(len(k) for k in self.children.values()), grace=self.cfg.shutdown_grace
        )
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.shutdown_grace
        while any(c.proc.poll() is None for k in self.children.values() for c in k) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for kids in self.children.values():
            for child in kids:
                child.proc.wait()
        self._reap(stopping=True)

    def _emit(self, event: str, **fields: Any) -> None:
        metrics.of(metrics.ACTIVATOR_EVENTS, self.namespace, str(fields.get("queue") or ""), event).inc()
        self._log(
            {
                "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                "event": event,
                "namespace": self.namespace,
                **fields,
            }
        )
