"""When to start a copy of an application. Pure: no I/O, no clock of its own (`now` is passed in,
seconds since the epoch, so notifications' timestamps compare with it and tests use a fake clock).

The rules, per queue:

1. A QUEUE_ACTIVATION notification starts ONE more copy, if fewer than max_concurrency run. This is
   what SSB's External Activator does, and it is the right unit: the worker re-notifies after the
   queue's notify_timeout while messages remain and nobody RECEIVEs, so a backlog that one reader
   cannot keep up with brings the next one, and readers are never started for conversation groups
   that existing readers hold locked (a reader per notification, not per message).
   Starting "up to need" (backlog or ready_groups at once) was rejected: the counts are a snapshot
   taken before the readers we already started began RECEIVing, and every surplus reader would
   only find the queue empty and exit.
2. A notification whose backlog is explicitly 0 starts nothing (the worker saw the queue drained).
   ready_groups is logged but does not gate starting: if it were misreported as 0, a gate would
   mean no reader ever starts, while a needless reader only exits.
3. A notification older than `stale_after` seconds starts nothing. After a restart the activator
   resumes at its committed offset and may replay old notifications; if work remains the worker
   notifies again, so an old one adds nothing but a burst of starts.
4. A notification for another namespace starts nothing (defensive: the topic is per namespace).
5. min_concurrency copies run at all times: on every tick, exited copies are replaced, so an
   always-on reader (RECEIVE with no WAITFOR timeout) survives crashes.
6. Replacing (rule 5) waits `restart_delay` after an exit, doubling after each consecutive
   failed exit (non-zero code, killed, or could not start) up to `backoff_max`, so a program that
   fails at once does not spin the CPU. A clean exit resets the doubling. Notifications are not
   delayed by it: each one is a fresh, already rate-limited, signal of work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbroker.activator.notification import Notification

# Reasons a decision gives; the runner logs them.
NOTIFIED, MIN_CONCURRENCY = "notification", "min_concurrency"
AT_MAX, NO_WORK, STALE, OTHER_NAMESPACE, UNKNOWN_QUEUE, BACKOFF, SATISFIED = (
    "at_max",
    "no_work",
    "stale",
    "other_namespace",
    "unknown_queue",
    "backoff",
    "satisfied",
)


@dataclass(frozen=True)
class Limits:
    min_concurrency: int = 0
    max_concurrency: int = 1

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or not 0 <= self.min_concurrency <= self.max_concurrency:
            raise ValueError(f"need 0 <= min_concurrency <= max_concurrency and max >= 1, got {self}")


@dataclass(frozen=True)
class Decision:
    start: int
    reason: str


@dataclass
class _Restarts:
    failures: int = 0  # consecutive failed exits
    not_before: float = float("-inf")  # rule 6


@dataclass
class Rules:
    limits: dict[str, Limits]
    namespace: str | None = None
    stale_after: float = 300.0
    restart_delay: float = 1.0
    backoff_max: float = 60.0
    _restarts: dict[str, _Restarts] = field(default_factory=dict)

    def on_notification(self, n: Notification, running: int, now: float) -> Decision:
        lim = self.limits.get(n.queue)
        if lim is None:
            return Decision(0, UNKNOWN_QUEUE)
        if self.namespace is not None and n.namespace is not None and n.namespace != self.namespace:
            return Decision(0, OTHER_NAMESPACE)
        if n.time is not None and now - n.time > self.stale_after:
            return Decision(0, STALE)
        if n.backlog == 0:
            return Decision(0, NO_WORK)
        if running >= lim.max_concurrency:
            return Decision(0, AT_MAX)
        return Decision(1, NOTIFIED)

    def on_tick(self, queue: str, running: int, now: float) -> Decision:
        lim = self.limits.get(queue)
        if lim is None:
            return Decision(0, UNKNOWN_QUEUE)
        missing = lim.min_concurrency - running
        if missing <= 0:
            return Decision(0, SATISFIED)
        if now < self._restarts.get(queue, _Restarts()).not_before:
            return Decision(0, BACKOFF)
        return Decision(missing, MIN_CONCURRENCY)

    def on_exit(self, queue: str, returncode: int, now: float) -> None:
        """A copy exited (returncode < 0: killed by a signal) or could not be started."""
        r = self._restarts.setdefault(queue, _Restarts())
        if returncode == 0:
            r.failures = 0
            r.not_before = now + self.restart_delay
        else:
            r.failures += 1
            r.not_before = now + min(self.backoff_max, self.restart_delay * 2 ** (r.failures - 1))

    def next_restart(self, queue: str) -> float | None:
        """When rule 6 next allows replacing a copy of the queue's application (None: no limit)."""
        r = self._restarts.get(queue)
        return None if r is None or r.not_before == float("-inf") else r.not_before
