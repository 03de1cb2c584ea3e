"""The timer service's schedule: which armed timers are due. Pure: no I/O, `now` is a parameter.

Entries come from the compacted timers topic, keyed by timer key. The last record of a key wins:
a later arm replaces an earlier one, a tombstone removes it. A heap with lazy deletion gives the
next due entry in O(log n); superseded heap items are skipped when they surface, and the heap is
rebuilt once stale items outnumber live ones, so memory follows the number of armed timers.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    key: str
    due: float  # epoch seconds
    partition: int
    offset: int
    value: Any  # what the service needs to fire it


class TimerSchedule:
    def __init__(self) -> None:
        self._live: dict[str, tuple[int, Entry]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def put(self, entry: Entry) -> None:
        seq = next(self._seq)
        self._live[entry.key] = (seq, entry)
        heapq.heappush(self._heap, (entry.due, seq, entry.key))
        self._maybe_compact()

    def remove(self, key: str) -> None:
        self._live.pop(key, None)
        self._maybe_compact()

    def drop_partitions(self, partitions: set[int]) -> None:
        """Forget the entries of partitions this instance no longer owns."""
        for key in [k for k, (_, e) in self._live.items() if e.partition in partitions]:
            del self._live[key]
        self._maybe_compact()

    def next_due(self) -> float | None:
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int = 500) -> list[Entry]:
        """Take out the live entries due at `now`, earliest first. A caller that fails to fire
        them puts them back."""
        out: list[Entry] = []
        while len(out) < limit:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            _, _, key = heapq.heappop(self._heap)
            out.append(self._live.pop(key)[1])
        return out

    def _skip_stale(self) -> None:
        while self._heap:
            _, seq, key = self._heap[0]
            live = self._live.get(key)
            if live is not None and live[0] == seq:
                return
            heapq.heappop(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._live):
            self._heap = [(e.due, seq, k) for k, (seq, e) in self._live.items()]
            heapq.heapify(self._heap)
