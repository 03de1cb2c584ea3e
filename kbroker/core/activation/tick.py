"""The periodic tick: which task sets are due, and which worker runs a tick (pure logic).

SSB's engine timer notifies the broker every 5 s; the broker counts the notifications and runs
some tasks on every one, some on every 2nd, some on every 5th (docs/sources.md#periodic-tasks). kbroker does the same
with a Faust timer, once per cluster rather than once per worker.

Tick numbers. Tick n covers [n * interval, (n + 1) * interval) of the wall clock, so every worker
computes the same number for the same moment without talking to the others; "every 2nd" means
n % 2 == 0, and so on.

A late timer (a GC pause, a rebalance, a worker that took over from a dead one) does not run a
burst of catch-up ticks: the ticks it missed are folded into one run, which carries the union of
the task sets that fell due in the gap, each once. The tasks are all "sweep what is due now"
(adjust readers, drop stale messages, close idle connections), so running one twice in a row buys
nothing, while skipping a 5th-tick set because its number was jumped over would delay it by
another 25 s. `TickRun.missed` tells how many were folded.

Once per cluster. The tick owner record (owner, lease expiry, last tick number run) lives in a
Faust table / single-partition topic. `claim` is a pure read-modify-write of that record and must
be applied serially, in log order, by whoever owns that one partition: then `last_tick` makes each
tick number run at most once whatever the clocks say, and the lease only keeps the ownership
sticky (no flapping between workers) and hands it over when the owner stops renewing. The owner
renews on every claim; a lease is 3 ticks (15 s by default), so a dead owner's ticks are taken over
within 15 s and the ticks in between are folded as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

TICK_SECONDS = 5.0  # docs/sources.md#periodic-tasks
# What each period runs, as in Service Broker (docs/sources.md#periodic-tasks). The cluster's tick (claim) runs the
# monitors every tick and reclaims queue records no reader needs every 5th (reclaim.py); each
# worker restarts its dead task handlers every tick. The routing services count the same tick
# numbers on their own (advance), each process for its own work: the dispatcher's sweep every tick;
# the transmitter's route check and connection attempts every 2nd, closing idle connections every
# 5th; the forwarder's connection attempts every 2nd, dropping stale forwarded messages every 5th.
EVERY_TICK = "every_tick"  # monitors adjust readers; restart dead task handlers; dispatcher sweep
EVERY_2ND = "every_2nd_tick"  # transport connects to destinations; transmitter reclassifies, forgets acks
EVERY_5TH = "every_5th_tick"  # cleanup: reclaim records; close idle connections; drop stale forwarded messages
PERIODS: tuple[tuple[str, int], ...] = ((EVERY_TICK, 1), (EVERY_2ND, 2), (EVERY_5TH, 5))
LEASE_TICKS = 3


@dataclass(frozen=True)
class TickSchedule:
    interval: float = TICK_SECONDS
    periods: tuple[tuple[str, int], ...] = PERIODS

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError("tick interval must be > 0")

    def number(self, now: float) -> int:
        """The tick that `now` falls in."""
        return math.floor(now / self.interval)

    def starts_at(self, number: int) -> float:
        """When tick `number` begins: arm the timer for starts_at(number(now) + 1)."""
        return number * self.interval

    def due(self, number: int) -> frozenset[str]:
        """Task sets due at tick `number`."""
        return frozenset(name for name, every in self.periods if number % every == 0)

    def due_between(self, last: int, number: int) -> frozenset[str]:
        """Task sets due at any tick in (last, number]: what a late run carries."""
        return frozenset(name for name, every in self.periods if number // every > last // every)


@dataclass(frozen=True)
class TickRun:
    number: int
    due: frozenset[str]
    missed: int = 0  # ticks before `number` that were folded into this run


@dataclass(frozen=True)
class TickCounter:
    """Last tick number run (None = never)."""

    last: int | None = None


def advance(
    counter: TickCounter, now: float, schedule: TickSchedule = TickSchedule()
) -> tuple[TickCounter, TickRun | None]:
    """The timer fired at `now`: run the current tick unless it already ran. Late -> one run."""
    n = schedule.number(now)
    if counter.last is None:
        return TickCounter(n), TickRun(n, schedule.due(n))
    if n <= counter.last:
        return counter, None  # early or duplicate timer, or a clock behind the last runner's
    return TickCounter(n), TickRun(n, schedule.due_between(counter.last, n), missed=n - counter.last - 1)


@dataclass(frozen=True)
class TickOwner:
    """The cluster-wide tick record."""

    owner: str | None = None
    expires_at: float = 0.0
    last_tick: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "expires_at": self.expires_at, "last_tick": self.last_tick}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TickOwner:
        if not d:
            return cls()
        return cls(d.get("owner"), float(d.get("expires_at", 0.0)), d.get("last_tick"))


def claim(
    record: TickOwner,
    me: str,
    now: float,
    schedule: TickSchedule = TickSchedule(),
    lease: float | None = None,
) -> tuple[TickRun | None, TickOwner]:
    """Worker `me`'s timer fired at `now`. Returns the tick to run (None = not mine or not due)
    and the record to store. Apply serially against the latest record (see module docstring)."""
    if record.owner not in (None, me) and now < record.expires_at:
        return None, record  # someone else holds a live lease
    if lease is None:
        lease = LEASE_TICKS * schedule.interval
    counter, run = advance(TickCounter(record.last_tick), now, schedule)
    return run, TickOwner(owner=me, expires_at=now + lease, last_tick=counter.last)


def release(record: TickOwner, me: str) -> TickOwner:
    """A worker shutting down cleanly lets the next claimer take over at once."""
    if record.owner != me:
        return record
    return replace(record, expires_at=0.0)
