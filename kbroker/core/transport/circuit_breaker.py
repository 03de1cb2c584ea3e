"""The receive circuit breaker (NServiceBus's): receiving that keeps failing, a receive or its
commit, for `time_to_wait` seconds without one success, raises the endpoint's critical error,
once until receiving works again. Pure: the time is a parameter. A handler's failures are not
receive failures: recoverability takes those."""

from __future__ import annotations

TIME_TO_WAIT = 120.0  # seconds of failures in a row before the critical error (NServiceBus: 2 minutes)


class ReceiveCircuitBreaker:
    """Armed, it counts failures from the first of a run; `failed` says when to trip."""

    def __init__(self, time_to_wait: float = TIME_TO_WAIT):
        if isinstance(time_to_wait, bool) or not 0 <= time_to_wait <= 86_400:
            raise ValueError(f"time_to_wait must be 0-86400 seconds, not {time_to_wait!r}")
        self.time_to_wait = time_to_wait
        self.failures = 0
        self._since: float | None = None
        self._tripped = False

    def failed(self, now: float) -> bool:
        """One more receive failure at `now` (monotonic seconds); True once, when the failures
        have gone on `time_to_wait` seconds: raise the critical error then."""
        self.failures += 1
        if self._since is None:
            self._since = now
        if not self._tripped and now - self._since >= self.time_to_wait:
            self._tripped = True
            return True
        return False

    def succeeded(self) -> None:
        """A receive (and its commit) worked: the run of failures is over; armed again."""
        self.failures = 0
        self._since = None
        self._tripped = False

    @property
    def failing_since(self) -> float | None:
        return self._since
