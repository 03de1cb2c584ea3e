"""Delayed delivery (the SQL Server transport's `<endpoint>.Delayed` table) as Kafka records.
Pure: no I/O, `now` is a parameter.

A send with a delivery time is not written to its destination but to the sending endpoint's
delayed store, the compacted topic `kbroker.<ns>.tdelayed.<endpoint>`, in the send's
transaction. One record is one row of the table:

    key         the row's own Id (a new GUID per row: the same message delayed to two queues is
                two rows), which the tombstone that removes the row repeats
    value       the Body (b"" with header `BodyNull: true` when the Body is NULL, since a null
                value is a tombstone)
    headers     the transport message's columns (core/transport/message.py), and `Due` (ISO 8601
                UTC, the table's Due column) and `Destination` (the queue it is moved to)

The endpoint's instances share the store's partitions; the one holding a partition moves each
due row to its destination and writes the row's tombstone in one Kafka transaction
(kafka/transport/delayed_store.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from kbroker.core import names
from kbroker.core.dialogs.envelope import MalformedRecord, header_text
from kbroker.core.records import Record
from kbroker.core.transport.bridge import address_of
from kbroker.core.transport.endpoint import QUEUE_RE
from kbroker.core.transport.message import (
    MAX_EXPIRES_MS,
    TransportMessage,
    format_expires,
    from_record,
    parse_expires,
    parse_iso,
    to_headers,
)

H_DUE = "Due"
H_DESTINATION = "Destination"
H_BODY_NULL = "BodyNull"
BATCH_SIZE = 100  # rows moved in one transaction (the SQL transport's BatchSize)
MAX_WAIT = 60.0  # seconds the mover waits at most between looks when nothing is due sooner
MEMORY_BUDGET = 64 * 1024 * 1024  # bytes of rows one instance holds; beyond: the latest-due are read again later
ROW_OVERHEAD = 400  # bytes an entry costs beyond its body and headers (objects, heap item)


@dataclass(frozen=True)
class DelayedDelivery:
    """How an endpoint's instances move its delayed store's due rows: `batch_size` rows per
    transaction (100), a look at least every `interval` seconds (1; a new row or the next due
    time wakes the mover sooner), at most `budget` bytes of rows held in memory."""

    batch_size: int = BATCH_SIZE
    interval: float = 1.0
    budget: int = MEMORY_BUDGET

    def __post_init__(self) -> None:
        for name in ("batch_size", "budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        if (
            isinstance(self.interval, bool)
            or not isinstance(self.interval, (int, float))
            or not 0 < self.interval <= 3600
        ):
            raise ValueError(f"interval must be seconds in (0, 3600], not {self.interval!r}")


def delayed_prefix(ns: str) -> str:
    """What every delayed store topic of the namespace starts with: `kbroker.<ns>.tdelayed.`."""
    return f"{names.prefix(ns)}tdelayed."


def delayed_topic(ns: str, endpoint: str) -> str:
    """The delayed store of endpoint `endpoint`: `kbroker.<ns>.tdelayed.<endpoint>`; its
    movers form the consumer group of the same name."""
    if not isinstance(endpoint, str) or not QUEUE_RE.fullmatch(endpoint):
        raise ValueError(f"endpoint name {endpoint!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
    return f"{delayed_prefix(ns)}{endpoint}"


def due_time(now_ms: float, delay: float | None = None, not_before: datetime | float | str | None = None) -> int | None:
    """The delivery time (epoch ms, rounded up) of a send, from `delay` (seconds from `now_ms`) or `not_before`
    (a datetime, epoch seconds, or ISO 8601 text; without an offset it is UTC); None for a send
    without one. ValueError naming the problem: both given, a negative or non-finite delay, a
    time past the year 9999. A time already passed is due at once, as in the SQL transport."""
    if delay is not None and not_before is not None:
        raise ValueError("give delay or not_before, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < math.inf:
            raise ValueError(f"delay must be a number of seconds of at least 0, not {delay!r}")
        due = _ceil_ms(round(now_ms * 1000 + delay * 1_000_000))
    elif not_before is not None:
        due = _epoch_ms(not_before)
    else:
        return None
    if due > MAX_EXPIRES_MS:
        raise ValueError("the delivery time is past the year 9999")
    return due


def _epoch_ms(when: datetime | float | str) -> int:
    # Rounded up to the millisecond: a message is never moved before the time it names.
    if isinstance(when, str):
        try:
            when = parse_iso(when)
        except ValueError:
            raise ValueError(f"not_before {when!r} is not an ISO 8601 time") from None
    if isinstance(when, datetime):
        dt = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        return _ceil_ms((dt - _EPOCH) // timedelta(microseconds=1))
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when < 0:
        raise ValueError(f"not_before must be a datetime, ISO 8601 text or epoch seconds, not {when!r}")
    return _ceil_ms(round(when * 1_000_000))


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _ceil_ms(us: int) -> int:
    return -(-us // 1000)


@dataclass(frozen=True)
class DelayedMessage:
    """One row of a delayed store: the message to move, where, and when."""

    key: bytes
    due_ms: int
    destination: str
    message: TransportMessage
    partition: int = -1
    offset: int = -1

    @property
    def size(self) -> int:
        """What holding the row costs, roughly, in bytes (the mover's memory budget)."""
        body = len(self.message.body or b"")
        return body + sum(len(k) + len(v) for k, v in self.message.headers.items()) + ROW_OVERHEAD


def delayed_record(topic: str, msg: TransportMessage, destination: str, due_ms: int) -> Record:
    """The record that stores `msg` in the delayed store `topic` until `due_ms`."""
    headers = to_headers(msg)
    headers.append((H_DUE, format_expires(due_ms).encode()))
    headers.append((H_DESTINATION, destination.encode()))
    if msg.body is None:
        headers.append((H_BODY_NULL, b"true"))
    return (topic, str(uuid.uuid4()).encode(), msg.body if msg.body is not None else b"", headers)


def from_delayed(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | str | None]] | None,
    partition: int = -1,
    offset: int = -1,
) -> DelayedMessage | None:
    """Decode a delayed store record: None for a tombstone (a row already moved), else the row;
    MalformedRecord naming what is wrong (another client may have written anything)."""
    if not key:
        raise MalformedRecord("a delayed row has no key")
    if value is None:
        return None
    extra: dict[str, str] = {}
    columns: list[tuple[str, bytes | str | None]] = []
    for name, raw in headers or ():
        if name in (H_DUE, H_DESTINATION, H_BODY_NULL):
            if name in extra:
                raise MalformedRecord(f"header {name!r} appears twice")
            try:
                extra[name] = header_text(raw)
            except UnicodeDecodeError:
                raise MalformedRecord(f"header {name!r} is not UTF-8") from None
        else:
            columns.append((name, raw))
    for name in (H_DUE, H_DESTINATION):
        if name not in extra:
            raise MalformedRecord(f"not a delayed row: missing header {name}")
    try:
        due = parse_expires(extra[H_DUE])
        format_expires(due)  # a time it cannot write again (before the year 1 in UTC) is refused now
    except (ValueError, OverflowError, OSError):
        raise MalformedRecord(f"Due {extra[H_DUE]!r} is not an ISO 8601 time of the years 1-9999") from None
    try:
        address_of(extra[H_DESTINATION], "x")
    except ValueError:
        raise MalformedRecord(f"Destination {extra[H_DESTINATION]!r} is not a transport address") from None
    body_null = extra.get(H_BODY_NULL, "false").strip().lower()
    if body_null not in ("true", "false"):
        raise MalformedRecord(f"BodyNull is {extra[H_BODY_NULL]!r}, not true or false")
    if body_null == "true" and value:
        raise MalformedRecord("BodyNull is true but the record has a body")
    msg = from_record(columns, None if body_null == "true" else value)
    return DelayedMessage(key, due, extra[H_DESTINATION], msg, partition, offset)


Place = tuple[int, int, int]  # (due ms, partition, offset): a row's place in the order rows are moved


def place(row: DelayedMessage) -> Place:
    """Where `row` stands among the rows to move: by due time, ties by partition and offset (a
    total order, so one horizon divides the rows held from those dropped, ties included)."""
    return (row.due_ms, row.partition, row.offset)


class DelayedSchedule:
    """The rows of the partitions an instance holds, by due time, within a memory budget.

    A row's last record wins: a tombstone removes it. The schedule keeps the earliest rows (by
    `place`) whose sizes fit `budget`; a row that does not fit is dropped (the latest first) and
    the horizon falls to its place. Rows before the horizon are all held, so they can be moved
    in order; once none is left (`exhausted`) the owner reads its partitions again from the
    start (`read_again`), and the rows dropped before are held this time. Memory follows the
    budget, whatever the number of rows waiting.

    A second read must not fill the budget with rows already moved (their tombstones come
    later in the log, so they look waiting when read): every row the last read saw before its
    horizon is gone by the time the schedule is exhausted, so the next read skips rows before
    that horizon at offsets that read reached."""

    def __init__(self, budget: int = MEMORY_BUDGET):
        self.budget = budget
        self.held_bytes = 0
        self._limit: Place | None = None  # the place of the earliest row dropped; None: none dropped
        self._gone: tuple[Place, dict[int, int]] | None = None  # (horizon, ends) of the last read: rows moved
        self._live: dict[bytes, tuple[int, DelayedMessage]] = {}
        self._due: list[tuple[Place, int, bytes]] = []  # earliest first (heap), lazily cleaned
        self._last: list[tuple[Place, int, bytes]] = []  # latest first (negated heap), lazily cleaned
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    @property
    def horizon(self) -> int | None:
        """The due time (epoch ms) of the earliest row dropped for the budget; None: none dropped."""
        return None if self._limit is None else self._limit[0]

    def put(self, row: DelayedMessage) -> None:
        """Hold `row` (replacing a row of its key), unless it lies past the horizon."""
        self.remove(row.key)
        at = place(row)
        if self._limit is not None and at >= self._limit:
            return
        if self._gone is not None and at < self._gone[0] and row.offset < self._gone[1].get(row.partition, -1):
            return  # moved already: its tombstone is further on
        seq = next(self._seq)
        self._live[row.key] = (seq, row)
        self.held_bytes += row.size
        heapq.heappush(self._due, (at, seq, row.key))
        heapq.heappush(self._last, ((-at[0], -at[1], -at[2]), -seq, row.key))
        while self.held_bytes > self.budget and len(self._live) > 1:
            self._drop_latest()
        self._maybe_compact()

    def remove(self, key: bytes) -> None:
        """A tombstone (or a row given back to the log): forget the row of `key` if held."""
        held = self._live.pop(key, None)
        if held is not None:
            self.held_bytes -= held[1].size

    def drop_partitions(self, partitions: set[int]) -> None:
        """Forget the rows of partitions this instance no longer holds."""
        for key in [k for k, (_, r) in self._live.items() if r.partition in partitions]:
            self.remove(key)
        self._maybe_compact()

    def read_again(self, ends: dict[int, int]) -> None:
        """The owner reads its partitions again from the start, having read each up to `ends`
        (partition: next offset): forget every row, and skip those moved already."""
        gone = self._limit
        self.clear()
        if gone is not None:
            self._gone = (gone, dict(ends))

    def clear(self) -> None:
        """Forget everything, horizon included (an assignment: the owner reads its partitions)."""
        self._gone = None
        self._live.clear()
        self._due.clear()
        self._last.clear()
        self.held_bytes = 0
        self._limit = None

    @property
    def exhausted(self) -> bool:
        """Rows were dropped and every row held has been moved: time to read again."""
        return self._limit is not None and not self._live

    def next_due(self) -> int | None:
        """The earliest held row's due time (epoch ms), if any."""
        self._clean(self._due, 1)
        return self._due[0][0][0] if self._due else None

    def pop_due(self, now_ms: int, limit: int = BATCH_SIZE) -> list[DelayedMessage]:
        """Take out up to `limit` held rows due at `now_ms`, earliest first. A caller that fails
        to move them puts them back."""
        out: list[DelayedMessage] = []
        while len(out) < limit:
            self._clean(self._due, 1)
            if not self._due or self._due[0][0][0] > now_ms:
                break
            _, _, key = heapq.heappop(self._due)
            _seq, row = self._live.pop(key)
            self.held_bytes -= row.size
            out.append(row)
        return out

    def _drop_latest(self) -> None:
        self._clean(self._last, -1)
        _neg, _, key = heapq.heappop(self._last)
        at = place(self._live[key][1])
        self.remove(key)
        self._limit = at if self._limit is None else min(self._limit, at)

    def _clean(self, heap: list[tuple[Place, int, bytes]], sign: int) -> None:
        while heap:
            _, seq, key = heap[0]
            live = self._live.get(key)
            if live is not None and live[0] == sign * seq:
                return
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._due) + len(self._last) > 128 and len(self._due) + len(self._last) > 4 * len(self._live):
            self._due = [(place(r), seq, k) for k, (seq, r) in self._live.items()]
            self._last = [((-r.due_ms, -r.partition, -r.offset), -seq, k) for k, (seq, r) in self._live.items()]
            heapq.heapify(self._due)
            heapq.heapify(self._last)
