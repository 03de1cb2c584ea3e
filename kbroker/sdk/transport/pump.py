"""The message pump: the transport's three concurrency models (docs/sources.md) for a transport
queue, with threads.

- fixed (pre-2.0): `max_concurrency` readers, always.
- ramp (2.1): RampUp's controller (sdk/pollers.RampedPollers), one to `max_concurrency` readers.
- monitor (3.0): one monitoring loop counts the messages waiting in this process's buffer and
  starts a receive task per waiting message, never more than `max_concurrency` running at once;
  each task receives one message, handles and commits it, and ends.

Polling Kafka is not the readers' job: each queue has one consumer per process, whose poll thread
fills the receiver's buffer (kafka/receive/receiver.py), so whatever the model, an idle queue costs one
poller. The readers wait on that buffer; idle, ramp keeps one reader and monitor none but its loop.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Protocol, Self

from kbroker.core.transport.endpoint import FIXED, MONITOR, RAMP, TransportSettings, receive_tasks_to_start
from kbroker.sdk.pollers import RampedPollers
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import Handler


class HandlingEndpoint(Protocol):
    """The endpoint as its readers see it (sdk/transport/endpoint.TransportEndpoint)."""

    settings: TransportSettings
    runtime: TransportRuntime

    def handle_one(
        self,
        queue: str,
        handler: Handler,
        wait: float | None,
        give_up_fast: bool = False,
        on_received: Callable[[], None] = lambda: None,
    ) -> bool: ...


WAIT = 1.0  # how long a reader's receive waits before it counts as an empty poll


class FixedPump:
    """pre-2.0: `n` readers, each looping receive-handle-commit."""

    def __init__(self, ep: HandlingEndpoint, queue: str, handler: Handler, n: int):
        self._ep, self.queue, self._handler, self._n = ep, queue, handler, n
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[tuple[threading.Thread, threading.Event]] = []  # a reader and its own stop
        self.peak = 0

    def start(self) -> Self:
        """Start the readers; returns self."""
        self.resize(self._n)
        return self

    def resize(self, n: int) -> None:
        """`n` readers from now on: more are started, or the extra ones stop after their current
        message."""
        with self._lock:
            self._n = n
            live = [(t, e) for t, e in self._threads if t.is_alive() and not e.is_set()]
            for _t, e in live[n:]:
                e.set()
            for i in range(len(live), n):
                e = threading.Event()
                t = threading.Thread(target=self._loop, args=(e,), name=f"kbroker-fixed-{self.queue}-{i}", daemon=True)
                self._threads.append((t, e))
                t.start()
            self._threads = [(t, e) for t, e in self._threads if t.is_alive()]
            self.peak = max(self.peak, min(len(self._threads), n))

    def _loop(self, retired: threading.Event) -> None:
        while not self._stop.is_set() and not retired.is_set():
            self._ep.handle_one(self.queue, self._handler, WAIT)

    def stats(self) -> dict[str, Any]:
        """The model, the queue, the readers alive and the most at once."""
        with self._lock:
            alive = sum(t.is_alive() and not e.is_set() for t, e in self._threads)
        return {"model": FIXED, "queue": self.queue, "readers": alive, "peak": self.peak}

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current transactions; wait up to `timeout` s for each reader."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for t, _e in threads:
            t.join(timeout)


class MonitorLoop:
    """3.0: one monitoring thread per input queue and up to `max_concurrency` receive tasks.
    `running` is how many tasks run now, `peak` the most that ever ran at once."""

    def __init__(self, ep: HandlingEndpoint, queue: str, handler: Handler, max_concurrency: int):
        self._ep, self.queue, self._handler, self._max = ep, queue, handler, max_concurrency
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self.running = 0
        self.peak = 0
        self.tasks_started = 0
        self._unclaimed = 0  # tasks started that have not received yet
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix=f"kbroker-task-{queue}")
        self._pool_size = max_concurrency
        self._old_pools: list[concurrent.futures.ThreadPoolExecutor] = []  # outgrown by resize, shut at stop
        self._thread = threading.Thread(target=self._loop, name=f"kbroker-monitor-{queue}", daemon=True)

    def start(self) -> Self:
        """Start the monitoring loop; returns self."""
        self._ep.runtime.receiver(self.queue)  # the consumer joins the group now, not on the first count
        self._thread.start()
        return self

    def _loop(self) -> None:
        receiver = self._ep.runtime.receiver(self.queue)
        while not self._stop.is_set():
            waiting = receiver.wait_for_waiting(WAIT)
            with self._cv:
                # Tasks started but not yet holding their message are still counted as waiting.
                start = receive_tasks_to_start(waiting - self._unclaimed, self.running, self._max)
                if start <= 0:
                    if waiting and self.running >= self._max:
                        self._cv.wait(WAIT)  # at the maximum: until a task ends
                    elif waiting:
                        self._cv.wait(0.01)  # counted, not yet taken by the started tasks
                    continue
                self.running += start
                self._unclaimed += start
                self.peak = max(self.peak, self.running)
                self.tasks_started += start
                pool = self._pool
            for _ in range(start):
                pool.submit(self._task)

    def resize(self, n: int) -> None:
        """At most `n` receive tasks from now on; running ones above it finish first."""
        with self._cv:
            self._max = n
            if n > self._pool_size:  # a pool's size is fixed: a bigger one for what comes
                self._old_pools.append(self._pool)
                self._pool_size = n
                self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=f"kbroker-task-{self.queue}")
            self._cv.notify_all()

    def _task(self) -> None:
        def received() -> None:
            with self._cv:
                self._unclaimed -= 1

        try:
            self._ep.handle_one(self.queue, self._handler, 0.0, give_up_fast=True, on_received=received)
        finally:
            with self._cv:
                self.running -= 1
                self._cv.notify_all()

    def stats(self) -> dict[str, Any]:
        """The model, the queue, the tasks running now and at most, and how many were started."""
        with self._cv:
            return {
                "model": MONITOR,
                "queue": self.queue,
                "readers": self.running,
                "peak": self.peak,
                "tasks_started": self.tasks_started,
                "max_concurrency": self._max,
            }

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop, then wait for the running tasks."""
        self._stop.set()
        self._thread.join(timeout)
        for pool in [*self._old_pools, self._pool]:
            pool.shutdown(wait=True)


def pump_for(ep: HandlingEndpoint, queue: str, handler: Handler, n: int) -> Any:
    """The reader set of the endpoint's model for `queue`, at most `n` at once."""
    model = ep.settings.model
    if model == FIXED:
        return FixedPump(ep, queue, handler, n)
    if model == RAMP:
        return _RampedPump(ep, queue, handler, n)
    return MonitorLoop(ep, queue, handler, n)


class _RampedPump(RampedPollers):
    def __init__(self, ep: HandlingEndpoint, queue: str, handler: Handler, n: int):
        super().__init__(lambda: ep.handle_one(queue, handler, WAIT), name=queue, max_readers=n)
        self.queue = queue
