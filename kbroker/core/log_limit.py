"""Rate-limited logging: a line that repeats (a broker that refuses connections, a procedure that
raises on every launch) is logged once, then counted and summarised once per window, and its
recovery is logged once. During a broker outage librdkafka, aiokafka and Faust each report every
failed connection attempt, which is thousands of lines a second across a worker's clients.

`LogLimiter` holds the decisions and takes its clock from the caller, so tests drive it with a fake
one. `RateLimitFilter` applies it to log records (as a filter on a logger or on a handler); lines
are grouped by logger, level and text with the numbers taken out (ports, offsets, node ids and
"after 0ms" vary between repeats of the same failure).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

DEFAULT_WINDOW = 30.0  # seconds between two lines about the same repeating thing
_NUMBERS = re.compile(r"\d+")


@dataclass
class _Seen:
    """One key's window: when its last line was written and how many repeats were held back."""

    window_start: float
    first_seen: float
    suppressed: int = 0
    total: int = 1
    sample: str = ""


@dataclass(frozen=True)
class Summary:
    """Repeats held back during one window: `count` lines like `sample` in `seconds`."""

    key: Hashable
    count: int
    seconds: float
    sample: str


@dataclass(frozen=True)
class Recovery:
    """A key that stopped failing: `failures` occurrences over `seconds`."""

    key: Hashable
    failures: int
    seconds: float


class LogLimiter:
    """Decides which occurrences of a repeating line are written. Thread-safe."""

    def __init__(self, window: float = DEFAULT_WINDOW, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self._clock = clock
        self._seen: dict[Hashable, _Seen] = {}
        self._lock = threading.Lock()

    def admit(self, key: Hashable, sample: str = "") -> int | None:
        """One occurrence of `key`. None: hold it back (counted). An int: write it; the int is
        how many occurrences were held back since the last one written (append it as a summary)."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = _Seen(window_start=now, first_seen=now, sample=sample)
                return 0
            seen.total += 1
            seen.sample = sample or seen.sample
            if now - seen.window_start < self.window:
                seen.suppressed += 1
                return None
            held, seen.suppressed, seen.window_start = seen.suppressed, 0, now
            return held

    def due_summaries(self) -> list[Summary]:
        """Windows that ended with repeats held back and no occurrence since to carry them: each
        is returned once (write it), and its count starts again."""
        now = self._clock()
        out: list[Summary] = []
        with self._lock:
            for key, seen in self._seen.items():
                if seen.suppressed and now - seen.window_start >= self.window:
                    out.append(Summary(key, seen.suppressed, now - seen.window_start, seen.sample))
                    seen.suppressed, seen.window_start = 0, now
        return out

    def recovered(self, key: Hashable) -> Recovery | None:
        """`key` succeeded: forget it. A Recovery (write it once) if it had been failing."""
        now = self._clock()
        with self._lock:
            seen = self._seen.pop(key, None)
        if seen is None:
            return None
        return Recovery(key, seen.total, now - seen.first_seen)

    def forget_quiet(self, quiet_for: float) -> None:
        """Drop keys not seen for `quiet_for` seconds with nothing held back, so a line that comes
        back much later is written again and the table does not grow without end."""
        now = self._clock()
        with self._lock:
            for key in [k for k, s in self._seen.items() if not s.suppressed and now - s.window_start >= quiet_for]:
                del self._seen[key]


def line_key(record: logging.LogRecord) -> tuple[str, int, str]:
    """Which repeating line a record is: logger, level and its text without the numbers."""
    return record.name, record.levelno, _NUMBERS.sub("#", record.getMessage())


class RateLimitFilter(logging.Filter):
    """A logging filter that writes the first of a run of equal lines, holds back the repeats and
    appends their count to the next line written for them. Applies to records at `min_level` or
    above, and to every record of the loggers named in `always` (and their children), once: a
    record that passed one such filter passes the next unchanged."""

    def __init__(
        self, limiter: LogLimiter | None = None, *, min_level: int = logging.WARNING, always: tuple[str, ...] = ()
    ):
        super().__init__()
        self.limiter = limiter or LogLimiter()
        self.min_level = min_level
        self.always = always

    def _applies(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.min_level:
            return True
        return any(record.name == n or record.name.startswith(n + ".") for n in self.always)

    def filter(self, record: logging.LogRecord) -> bool:
        # A record another RateLimitFilter already let through (one on its logger, then one on a
        # handler) is not counted twice.
        if (
            getattr(record, "kbroker_summary", False)
            or not self._applies(record)
            or getattr(record, "kbroker_limited_by", self) is not self
        ):
            return True
        text = record.getMessage()
        held = self.limiter.admit(line_key(record), text)
        if held is None:
            return False
        record.kbroker_limited_by = self
        if held:  # the count goes on a line of its own: some handlers re-format the record
            logging.getLogger(record.name).log(
                record.levelno,
                "%d more like this in the last %.0f s, before:",
                held,
                self.limiter.window,
                extra={"kbroker_summary": True},
            )
        return True

    def write_summaries(self, logger: logging.Logger) -> int:
        """Write, on `logger`, one line per window that ended with repeats held back; how many."""
        summaries = self.limiter.due_summaries()
        for s in summaries:
            name, level, _ = s.key if isinstance(s.key, tuple) and len(s.key) == 3 else ("?", logging.WARNING, "")
            logger.log(
                level if isinstance(level, int) else logging.WARNING,
                "%d more like this in the last %.0f s (%s): %s",
                s.count,
                s.seconds,
                name,
                s.sample,
                extra={"kbroker_summary": True},
            )
        self.limiter.forget_quiet(4 * self.limiter.window)
        return len(summaries)
