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
