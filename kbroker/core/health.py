"""A process's degraded reasons and the back-off of its failing periodic work (pure: the caller
gives the time). A component (the tick, the catalog refresh, a queue's procedure, the timer
service) that fails is recorded with its error and retried after a delay that doubles with each
failure in a row; its first success clears it. The process is degraded while any reason stands.
A reason may belong to one queue (its procedure, its count): a queue's view shows the process-wide
reasons and its own, not every other queue's."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

BASE_DELAY = 0.5  # seconds before the first retry
MAX_DELAY = 10.0  # the longest wait between retries: a recovered broker is noticed this fast


@dataclass(frozen=True)
class Reason:
    """Why a component is failing: its last error, since when, how many failures in a row."""

    component: str
    error: str
    retriable: bool
    since: float
    last: float
    failures: int
    retry_at: float
    queue: str | None = None  # the queue it concerns; None: the whole process

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "error": self.error,
            "retriable": self.retriable,
            "since": self.since,
            "last": self.last,
            "failures": self.failures,
            "queue": self.queue,
        }


def backoff(failures: int, base: float = BASE_DELAY, cap: float = MAX_DELAY) -> float:
    """Seconds to wait after `failures` failures in a row: base, 2 x base, 4 x base, ... up to cap."""
    return float(min(cap, base * 2.0 ** max(0, failures - 1)))


class Health:
    """The standing degraded reasons of one process, by component. Thread-safe."""

    def __init__(self, base_delay: float = BASE_DELAY, max_delay: float = MAX_DELAY):
        self.base_delay, self.max_delay = base_delay, max_delay
        self._reasons: dict[str, Reason] = {}
        self._lock = threading.Lock()

    def failed(self, component: str, error: str, retriable: bool, now: float, queue: str | None = None) -> Reason:
        """`component` (of `queue`, or of the whole process) failed at `now`: record it; the
        Reason says when to try again."""
        with self._lock:
            old = self._reasons.get(component)
            failures = 1 if old is None else old.failures + 1
            since = now if old is None else old.since
            reason = Reason(
                component,
                error,
                retriable,
                since,
                now,
                failures,
                now + backoff(failures, self.base_delay, self.max_delay),
                queue,
            )
            self._reasons[component] = reason
            return reason

    def succeeded(self, component: str) -> Reason | None:
        """`component` worked: clear it; the reason it had, if it was failing."""
        with self._lock:
            return self._reasons.pop(component, None)

    def due(self, component: str, now: float) -> bool:
        """Whether `component` may run at `now` (not failing, or its back-off is over)."""
        with self._lock:
            reason = self._reasons.get(component)
        return reason is None or now >= reason.retry_at

    def failing(self, component: str) -> bool:
        """Whether `component`'s last run failed (it has a standing reason)."""
        with self._lock:
            return component in self._reasons

    def reasons(self) -> list[Reason]:
        with self._lock:
            return sorted(self._reasons.values(), key=lambda r: r.component)

    @property
    def degraded(self) -> bool:
        with self._lock:
            return bool(self._reasons)

    def snapshot(self, queue: str | None = None) -> dict[str, Any]:
        """{"degraded": bool, "reasons": [...]} for views: every reason, or with `queue` the ones
        of the whole process and of that queue (a queue monitor's row)."""
        reasons = [r for r in self.reasons() if queue is None or r.queue in (None, queue)]
        return {"degraded": bool(reasons), "reasons": [r.to_dict() for r in reasons]}
