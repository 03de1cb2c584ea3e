"""Kafka's transaction log (`__transaction_state`) read for one transactional id: pure parsing and
the one question kbroker asks of it, how the last transaction before a producer's init ended.

Why kbroker reads it: an in-doubt commit (commit_transaction asked, no answer) is settled by the
queue group's committed offsets (faults.committed_by_offsets). When Kafka's coordinator
completed that transaction without writing its markers (it does so for a partition it takes for
deleted, as a one-node broker starts: README, "A transaction the broker left open"), those offsets
stay unstable for good and cannot tell. The coordinator's own record of the transaction can: each
state change of a transactional id is a record of this log, keyed by the id.

The formats are Kafka's TransactionLogKey (version 0) and TransactionLogValue (version 0, and 1,
the first flexible version: compact strings and arrays, tagged fields). Records come from the
broker and are parsed defensively: anything malformed raises TxnLogFormatError.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable

TRANSACTION_LOG = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"


class TxnLogFormatError(ValueError):
    """A record of the transaction log that is not in a format this module knows."""


class TxnState(IntEnum):
    """Kafka's TransactionState, as the log stores it."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


@dataclass(frozen=True)
class TxnLogEntry:
    """One state of a transactional id: its producer, the state, the partitions it names."""

    producer_id: int
    producer_epoch: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)


def partition_of(transactional_id: str, partitions: int) -> int:
    """The log partition holding `transactional_id` (Kafka: Utils.abs(id.hashCode()) % n, with
    Java's String.hashCode over UTF-16 code units)."""
    if partitions <= 0:
        raise ValueError("the transaction log has at least one partition")
    h = 0
    units = transactional_id.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


class _Reader:
    """A cursor over one record's bytes; every read past the end is a TxnLogFormatError."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise TxnLogFormatError(f"record ends early (wanted {n} bytes at {self.at} of {len(self.data)})")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def fixed(self, fmt: str) -> int:
        value: int = struct.unpack(">" + fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise TxnLogFormatError("varint longer than 5 bytes")

    def string(self, compact: bool) -> str:
        n = self.uvarint() - 1 if compact else self.fixed("h")
        if n < 0:
            raise TxnLogFormatError("a null string where a topic name belongs")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TxnLogFormatError(f"a string that is not UTF-8: {exc}") from None

    def count(self, compact: bool) -> int:
        """An array's length; -1 for null."""
        return self.uvarint() - 1 if compact else self.fixed("i")

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def parse_key(data: bytes | None) -> str | None:
    """The transactional id a log record is about; None for a key of another kind or version."""
    if data is None:
        return None
    r = _Reader(data)
    if r.fixed("h") != 0:
        return None
    return r.string(compact=False)


def parse_value(data: bytes) -> TxnLogEntry:
    """A TransactionLogValue (a tombstone, None, is the caller's: the id expired)."""
    r = _Reader(data)
    version = r.fixed("h")
    if version not in (0, 1):
        raise TxnLogFormatError(f"transaction log value version {version} is not known")
    compact = version >= 1
    producer_id, epoch = r.fixed("q"), r.fixed("h")
    r.fixed("i")  # the transaction timeout
    status = r.fixed("b")
    try:
        state = TxnState(status)
    except ValueError:
        raise TxnLogFormatError(f"transaction state {status} is not known") from None
    parts: set[tuple[str, int]] = set()
    for _ in range(max(r.count(compact), 0)):
        topic = r.string(compact)
        n = r.count(compact)
        if n > (len(r.data) - r.at) // 4:
            raise TxnLogFormatError(f"{n} partitions cannot fit in what is left of the record")
        parts.update((topic, r.fixed("i")) for _ in range(max(n, 0)))
        if compact:
            r.skip_tags()
    r.fixed("q")  # last update
    r.fixed("q")  # start
    if compact:
        r.skip_tags()
    return TxnLogEntry(producer_id, epoch, state, frozenset(parts))


_COMMITTED = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
_ABORTED = (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT, TxnState.PREPARE_EPOCH_FENCE)


@dataclass(frozen=True)
class Outcome:
    """How a transaction ended, by the coordinator's record, and the data partitions it wrote
    to (the offsets topic left out)."""

    committed: bool
    partitions: frozenset[tuple[str, int]]


def outcome_before_init(entries: list[TxnLogEntry]) -> Outcome | None:
    """How the last transaction before the id's latest init ended, from its log entries in
    order; None when the log does not say.

    A producer's init writes an EMPTY entry of a new epoch, after ending (aborting) a
    transaction still open; an init retried writes more. So, going back from the latest EMPTY
    past any other EMPTY, the first entry met is the transaction's decision (an ONGOING there
    means none was decided); its partitions are those of the entries back to the transaction
    before it (a COMPLETE entry) or the init before it. The caller knows the transaction began
    (its offsets were sent): otherwise the decision met would be an earlier transaction's."""
    i = max((i for i, e in enumerate(entries) if e.state is TxnState.EMPTY), default=-1) - 1
    while i >= 0 and entries[i].state is TxnState.EMPTY:
        i -= 1
    if i < 0 or entries[i].state not in _COMMITTED + _ABORTED:
        return None
    committed = entries[i].state in _COMMITTED
    parts = set(entries[i].partitions)
    i -= 1
    while i >= 0 and entries[i].state not in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        parts.update(entries[i].partitions)
        i -= 1
    return Outcome(committed, frozenset(p for p in parts if p[0] != OFFSETS_TOPIC))


# How long an in-doubt transaction's offsets may stay unreadable, with a new producer of its id
# ready, before it is taken for an open transaction and the transaction log is asked: Kafka
# writes a transaction's markers within milliseconds once its coordinator decided, so this is
# ample for a slow broker.
OPEN_TRANSACTION_AFTER = 10.0


class OpenTransactionCheck:
    """The settling of one in-doubt transaction whose offsets do not answer, as an open
    transaction: when to ask the transaction log (after OPEN_TRANSACTION_AFTER s of unreadable
    offsets, then at most as often), and what it said, kept: once the committer's closing
    transaction ran, the log's latest transaction is that one, not the in-doubt one."""

    def __init__(self, *, after: float = OPEN_TRANSACTION_AFTER, clock: Callable[[], float] = time.monotonic):
        self.outcome: Outcome | None = None
        self._after, self._clock = after, clock
        self._since: float | None = None
        self._next = 0.0
        self._told = False

    def due(self) -> bool:
        """Called at each unreadable answer: whether to ask the log (or close) now."""
        now = self._clock()
        if self._since is None:
            self._since = now
        if now - self._since < self._after or now < self._next:
            return False
        self._next = now + self._after
        return True

    def first_failure(self) -> bool:
        """Whether this is the first time the log could not tell (worth a log line)."""
        told, self._told = self._told, True
        return not told
