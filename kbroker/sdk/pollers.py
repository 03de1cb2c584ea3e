"""Pollers: adaptive polling readers for a queue without activation (NServiceBus 2.1's ramp-up).

    pool = PollerPool(broker, "ExpenseQueue", handle, max_readers=8).start()
    ...
    pool.stop()

Each poller loops: a transaction, RECEIVE TOP(top) WAITFOR(wait), `handle(tx, messages)`, commit.
The decisions come from `core.ramp.RampUp`: consecutive RECEIVEs that found messages add a
poller (up to `max_readers`), consecutive empty ones retire the poller that came back empty (down
to one). A handler that raises rolls its transaction back (the messages come back; five in a row
disable the queue, as poison messages do) and counts as a successful poll, since work was there.

RampedPollers is the controller alone, over any "poll once" function: transport queues and their
secondaries (sdk/transport/pump.py) ramp up the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Self

from kbroker.core.activation.ramp import RampUp
from kbroker.core.dialogs.envelope import Message
from kbroker.errors import KBrokerError, QueueDisabledError

log = logging.getLogger("kbroker.pollers")

Handler = Callable[[Any, list[Message]], None]  # (transaction, messages of one conversation group)


class RampedPollers:
    """Threads that each call `poll()` (True: it found work) in a loop; their number follows
    the load by RampUp, between one and `max_readers`. `peak` is the most at once."""

    def __init__(self, poll: Callable[[], bool], *, name: str, max_readers: int = 4):
        self._poll_once, self.name = poll, name
        self._ramp = RampUp(max_readers=max_readers)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._retire = 0  # readers to stop after their current poll (the maximum was lowered)
        self.peak = 0

    @property
    def readers(self) -> int:
        """How many readers run now."""
        with self._lock:
            return len(self._threads)

    def start(self) -> Self:
        """Start the first reader; returns self."""
        self._spawn()
        return self

    def _spawn(self) -> None:
        t = threading.Thread(target=self._loop, name=f"kbroker-pool-{self.name}", daemon=True)
        with self._lock:
            self._threads.add(t)
            self.peak = max(self.peak, len(self._threads))
        t.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while not self._stop.is_set():
                got = self._poll_once()
                with self._lock:
                    if self._retire > 0:
                        self._retire -= 1
                        return
                    self._ramp, delta = self._ramp.observe(got)
                if delta > 0:
                    self._spawn()
                elif delta < 0:
                    return  # the reader that came back empty retires
        finally:
            with self._lock:
                self._threads.discard(me)

    def resize(self, max_readers: int) -> None:
        """A new maximum (MaximumConcurrencyLevel): readers above it stop after their current poll."""
        with self._lock:
            self._ramp, delta = self._ramp.with_max(max_readers)
            self._retire += max(0, -delta)

    def stats(self) -> dict[str, int | str]:
        """The model, the queue, the readers now and the most at once."""
        return {"model": "ramp", "queue": self.name, "readers": self.readers, "peak": self.peak}

    def stop(self, timeout: float = 30.0) -> None:
        """Ask every reader to stop after its current poll and wait up to `timeout` s for each."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)


class PollerPool(RampedPollers):
    """Readers of `queue` that each RECEIVE in a transaction and pass the messages to `handle`;
    their number follows the load, between one and `max_readers`. `peak`, `handled` and
    `failures` count the most readers at once, the messages handled, and the handler failures."""

    def __init__(
        self, broker: Any, queue: str, handle: Handler, *, max_readers: int = 4, top: int = 10, wait: float = 1.0
    ):
        super().__init__(self._poll, name=queue, max_readers=max_readers)
        self.broker, self.queue, self._handle = broker, queue, handle
        self._top, self._wait = top, wait
        self.handled = 0
        self.failures = 0

    def _poll(self) -> bool:
        try:
            with self.broker.transaction() as tx:
                msgs = tx.receive(self.queue, top=self._top, wait=self._wait)
                if msgs:
                    self._handle(tx, msgs)
            if msgs:
                with self._lock:
                    self.handled += len(msgs)
            return bool(msgs)
        except QueueDisabledError:
            self._stop.wait(self._wait)  # disabled (poison messages): idle until enabled again
            return False
        except KBrokerError as exc:
            log.warning("reader on %s: %s", self.queue, exc)
            return False
        except Exception:
            log.exception("handler on %s failed; its transaction rolled back", self.queue)
            with self._lock:
                self.failures += 1
            return True


ReaderPool = PollerPool  # the name kbroker.ReaderPool was published under
