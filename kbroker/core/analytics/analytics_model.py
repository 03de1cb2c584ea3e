"""The analytics state's data model (core/analytics/queue_analytics.py): its inputs (Arrival,
Progress), its output (Output), and what it keeps per queue partition, window and dialog side,
as plain records, apart from the rules that fill them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arrival:
    queue: str
    partition: int
    offset: int
    ts: int  # the record's timestamp, epoch ms
    message_id: str
    conversation_id: str
    side: str  # the side that receives it
    group: str
    message_type: str
    rekeyed_from: str | None = None  # "<partition>:<offset>" of the record a MOVE re-keyed


@dataclass(frozen=True)
class Progress:
    queue: str
    at: int  # epoch ms of the snapshot
    partitions: tuple[tuple[int, int, frozenset[int]], ...]  # (partition, committed or -1, completed)


@dataclass
class Partition:
    pending: dict[int, list[Any]] = field(default_factory=dict)  # offset -> [ts, group, dialog]; offset order
    committed: int = -1
    completed: set[int] = field(default_factory=set)
    top: int = -1  # the highest offset of earlier batches: a record at or below it is one seen already
    fresh: set[int] = field(default_factory=set)  # the offsets taken in this batch, in any order

    def received(self, offset: int) -> bool:
        return offset < self.committed or offset in self.completed


@dataclass
class Window:
    arrivals: int = 0
    receives: int = 0
    gauges: dict[str, Any] = field(default_factory=dict)  # backlog, ages, stale counts as last measured
    closed: bool = False  # its final row went to history (again, if a late record changes it)


@dataclass
class Dialog:
    queue: str
    group: str = ""
    pending: int = 0
    last_arrival: int | None = None
    last_receive: int | None = None
    last_error: int | None = None
    timers: int = 0
    klass: str | None = None
    seen: int = 0  # when last touched
    previous: str | None = None  # the class before `klass`
    shown: list[int | None] | None = None  # [oldest unreceived ts, backlog] as its last record said


@dataclass
class Output:
    """What one batch changed: analytics records (key, value), control commands (key, value), and
    the final rows of windows that closed (for history)."""

    analytics: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    closed: list[dict[str, Any]] = field(default_factory=list)
