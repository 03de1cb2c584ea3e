"""Adaptive concurrency for plain polling consumers (pure logic).

For queues without activation, kbroker polls the way NServiceBus's SQL Server transport 2.1 did
(docs/sources.md): a ramp-up controller adds a poller while polls keep finding messages and removes one
while they keep coming back empty. Idle, a queue keeps exactly one poller.

The seed gives the algorithm but not the thresholds; the numbers are those of the transport's 2.1
source (RampUpController): a poller is added once consecutive successes go over 5 (the 6th in a
row) and one is retired when consecutive failures reach 3. Counters are shared by the queue's
pollers and reset after each change, so the pool grows or shrinks by one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GROW_AFTER = 6  # NSB 2.1: HasTooMuchWork = consecutiveSuccesses > 5
SHRINK_AFTER = 3  # NSB 2.1: HasEnoughWork = consecutiveFailures < 3


@dataclass(frozen=True)
class RampUp:
    max_readers: int  # MaximumConcurrencyLevel
    readers: int = 1
    successes: int = 0  # consecutive polls that found a message
    failures: int = 0  # consecutive empty polls
    grow_after: int = GROW_AFTER
    shrink_after: int = SHRINK_AFTER

    def __post_init__(self) -> None:
        if self.max_readers < 1 or self.grow_after < 1 or self.shrink_after < 1:
            raise ValueError("max_readers, grow_after and shrink_after must be >= 1")

    def observe(self, got_message: bool) -> tuple[RampUp, int]:
        """One poll finished. Returns the new state and the change in pollers: +1 start one,
        -1 stop one (the one that just polled empty is the natural one to stop), 0 nothing."""
        if got_message:
            s = replace(self, successes=self.successes + 1, failures=0)
            if s.successes >= s.grow_after and s.readers < s.max_readers:
                return replace(s, readers=s.readers + 1, successes=0), +1
            # Saturate so an endless run at the maximum does not grow the counter for ever.
            return replace(s, successes=min(s.successes, s.grow_after)), 0
        s = replace(self, failures=self.failures + 1, successes=0)
        if s.failures >= s.shrink_after and s.readers > 1:
            return replace(s, readers=s.readers - 1, failures=0), -1
        return replace(s, failures=min(s.failures, s.shrink_after)), 0

    def with_max(self, max_readers: int) -> tuple[RampUp, int]:
        """MaximumConcurrencyLevel changed: stop pollers above the new maximum at once."""
        s = replace(self, max_readers=max_readers)
        if s.readers > max_readers:
            return replace(s, readers=max_readers), max_readers - self.readers
        return s, 0
