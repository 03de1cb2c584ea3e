"""CPU time and peak RSS of one side of a row, measured in the process that runs it.

Both sides of a row run in the bench's process one after the other, so the process's lifetime peak
(ru_maxrss) would give the second side the first one's peak: the kernel's high-water mark is reset
before each side instead (writing 5 to /proc/self/clear_refs, Linux), and read from VmHWM after.
Where that cannot be done, the peak is the lifetime one and says so."""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def peak_rss_mb() -> float | None:
    """The process's peak RSS in MB (VmHWM; None where /proc does not say)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        _CLEAR.write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def usage(detail: dict) -> Iterator[None]:
    """Adds to `detail`, when the block ends: cpu_seconds (the process's, every thread and
    librdkafka's included, over the block) and peak_rss_mb (the process's peak during the block;
    peak_rss_scope says "side" when it was reset at the start, "process" when it could not be)."""
    reset = _reset_hwm()
    cpu0 = time.process_time()
    try:
        yield
    finally:
        detail["cpu_seconds"] = round(time.process_time() - cpu0, 3)
        peak = peak_rss_mb() if reset else None
        if peak is None:
            peak, reset = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, False
        detail["peak_rss_mb"] = round(peak, 1)
        detail["peak_rss_scope"] = "side" if reset else "process"


def measured_with_usage(measure: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """measure(*args) (a side's {"value", "detail"}) with usage() added to its detail."""
    used: dict[str, Any] = {}
    with usage(used):
        out = measure(*args)
    out["detail"].update(used)
    return out
