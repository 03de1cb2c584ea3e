"""The loop of kbroker's background services (timer service, dispatcher, transmitter): one step
after another until stopped, a failed step reported and retried after a second. A step that
failed raises (after leaving its service ready to go on), so it is reported once and the next
step that succeeds clears the failure. Only the authorizer's refusal stops the loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from kbroker.errors import is_refusal


class FailureSink(Protocol):
    """Where a service reports its failures and recoveries (the worker's guard): logged once
    per window, kept as a degraded reason."""

    def failed(self, component: str, exc: BaseException) -> None: ...

    def succeeded(self, component: str) -> None: ...


class LoggedOnce:
    """A FailureSink for a service that runs without the worker's guard (an endpoint's delayed
    store mover): the first failure of a run is logged at WARNING, the rest at DEBUG, and the
    recovery once, with how many steps failed (an outage is one line, not one a second)."""

    def __init__(self, log: logging.Logger):
        self._log = log
        self._failing: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, component: str, exc: BaseException) -> None:
        with self._lock:
            n = self._failing[component] = self._failing.get(component, 0) + 1
        self._log.log(logging.WARNING if n == 1 else logging.DEBUG, "%s step failed: %s", component, exc)

    def succeeded(self, component: str) -> None:
        with self._lock:
            n = self._failing.pop(component, 0)
        if n:
            self._log.info("%s recovered after %d failed steps", component, n)


def report(guard: FailureSink | None, component: str, exc: BaseException, log: logging.Logger) -> None:
    """A failure of `component`: to the guard, or logged when it runs without one."""
    if guard is None:
        log.warning("%s step failed: %s", component, exc)
    else:
        guard.failed(component, exc)


def run_steps(
    step: Callable[[], None], stop: threading.Event, component: str, guard: FailureSink | None, log: logging.Logger
) -> BaseException | None:
    """Steps until `stop` is set; None then. The authorizer's refusal ends the loop instead (it
    stands until an operator grants the ACL: retrying every second would only repeat it): it is
    reported, logged and returned."""
    while not stop.is_set():
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - keep going: one failed step must not stop the service
            report(guard, component, exc, log)
            if is_refusal(exc):
                log.error("%s stopped: %s", component, exc)
                return exc
            stop.wait(1.0)
        else:
            if guard is not None:
                guard.succeeded(component)
    return None
