"""The class of a dialog, for the transmitter's reclassification (a 2nd-tick task, docs/sources.md): a pure
rule from what the analytics job knows of one dialog side. First match wins (docs/analytics.md)."""

from __future__ import annotations

from dataclasses import dataclass

ERRORING, STALE, BACKLOGGED, ACTIVE, TIMER_PENDING, IDLE = (
    "erroring",
    "stale",
    "backlogged",
    "active",
    "timer_pending",
    "idle",
)
# Reserved for the transmission path (routing between brokers): not produced yet.
ROUTE_EXPIRED, RESOURCE_STARVED = "route_expired", "resource_starved"
CLASSES = (ERRORING, STALE, BACKLOGGED, ACTIVE, TIMER_PENDING, IDLE, ROUTE_EXPIRED, RESOURCE_STARVED)

BACKLOGGED_AT = 10  # unreceived messages that make a dialog backlogged


@dataclass(frozen=True)
class DialogFacts:
    """What is known of one dialog side at `now_ms` (epoch ms; None: never)."""

    now_ms: int
    window_s: float  # "recent" means within one analytics window
    stale_after_s: float  # the dialog's queue's threshold
    backlog: int = 0
    oldest_ms: int | None = None  # timestamp of its oldest unreceived message
    last_arrival_ms: int | None = None
    last_receive_ms: int | None = None
    last_error_ms: int | None = None  # an Error message or a dead-lettered one
    timers: int = 0  # armed dialog timers

    def recent(self, at: int | None) -> bool:
        return at is not None and self.now_ms - at <= self.window_s * 1000


def classify(f: DialogFacts) -> tuple[str, str]:
    """(class, reason in words)."""
    if f.recent(f.last_error_ms):
        return ERRORING, f"an error within the last {f.window_s:g} s"
    if f.oldest_ms is not None and f.now_ms - f.oldest_ms >= f.stale_after_s * 1000:
        # No age in the words: the record outlives this moment, and a view shows the age now.
        return STALE, f"oldest unreceived message older than the queue's stale_after ({f.stale_after_s:g} s)"
    if f.backlog >= BACKLOGGED_AT:
        return BACKLOGGED, f"{f.backlog} unreceived messages"
    if f.recent(f.last_arrival_ms) or f.recent(f.last_receive_ms):
        return ACTIVE, f"messages sent or received within the last {f.window_s:g} s"
    if f.timers:
        return TIMER_PENDING, "a dialog timer is armed"
    return IDLE, f"nothing sent or received for {f.window_s:g} s"
