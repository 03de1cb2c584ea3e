"""Out-of-order offset completion for one partition (pure logic, no I/O).

Readers finish conversation groups in any order, so a partition's offsets complete out of order.
The offset committed to Kafka is the lowest offset fetched and not yet completed; the completed
offsets above it travel in the commit's metadata, so whoever owns the partition next skips them.
Offsets are not contiguous (transaction markers, aborted records and compaction leave gaps), so
the tracker reasons only about offsets it was actually handed.
"""

from __future__ import annotations

import base64
import heapq
import zlib
from typing import Collection

from kbroker.core.txn.commit_holder import ROOM as HOLDER_ROOM
from kbroker.core.txn.commit_holder import split_holder

METADATA_LIMIT = 4096  # Kafka's default offset.metadata.max.bytes
_PREFIX = "kb1:"
# So few completed offsets fit whatever their gaps: <= 5 varint bytes each, base64 adds a third.
_SURELY_FITS = 400
# The most one more completed offset can add to the encoded metadata: a 5-byte varint, which
# deflate at worst stores as is and base64 makes 4/3 of (rounded up, with slack).
_GROWTH_PER_OFFSET = 8
_ROOM_MARGIN = 256


def put_uvarint(n: int, out: bytearray) -> None:
    """Append `n` as an unsigned LEB128 varint (Kafka's unsigned varint too)."""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def encode_completed(base: int, completed: list[int]) -> str:
    """Offsets above `base` as sorted deltas, varint-packed, deflated, base64: a few bytes each."""
    raw = bytearray()
    prev = base
    for off in sorted(completed):
        if off <= prev:
            continue  # duplicates and anything at or below the base carry no information
        put_uvarint(off - prev, raw)
        prev = off
    if not raw:
        return ""
    return _PREFIX + base64.b64encode(zlib.compress(bytes(raw), 9)).decode()


def decode_completed(base: int, metadata: str | None) -> set[int]:
    """Inverse of encode_completed (a commit holder after it ignored). Foreign or damaged metadata
    means "nothing completed above"."""
    metadata = split_holder(metadata)[0]
    if not metadata or not metadata.startswith(_PREFIX):
        return set()
    try:
        raw = zlib.decompress(base64.b64decode(metadata[len(_PREFIX) :]))
    except (ValueError, zlib.error):
        return set()
    out, prev, n, shift = set(), base, 0, 0
    for b in raw:
        n |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
            continue
        prev += n
        out.add(prev)
        n, shift = 0, 0
    return out


class PartitionOffsets:
    """Tracks one partition from the committed position the owner started at."""

    def __init__(self, committed: int, metadata: str | None = None):
        self.start = committed
        self._high = committed  # one past the highest offset fetched
        self._incomplete: set[int] = set()
        self._heap: list[int] = []  # lazy min-heap over _incomplete
        self._completed_above = decode_completed(committed, metadata)
        self._skip = set(self._completed_above)
        # Completed by a Kafka transaction not known to have committed: its abort reopens them
        # (reopen), its commit settles them (settled).
        self._pending: set[int] = set()
        # metadata_room() measures the encoding now and then and bounds it in between:
        # (encoded size, completions counted) at the last measurement, None when out of date.
        self._measured: tuple[int, int] | None = None
        self._completions = 0  # complete() calls so far
        self._full_at: tuple[int, int] | None = None  # (low water, completions) when found full

    def already_done(self, offset: int) -> bool:
        """True for a record completed by an earlier owner (listed in the commit metadata)."""
        return offset in self._skip

    def fetched(self, offset: int) -> None:
        self._high = max(self._high, offset + 1)
        if offset in self._skip:
            return
        if offset not in self._incomplete:
            self._incomplete.add(offset)
            heapq.heappush(self._heap, offset)

    def complete(self, offset: int) -> None:
        if offset in self._incomplete:
            self._incomplete.discard(offset)
            self._completed_above.add(offset)
            self._pending.add(offset)
            self._completions += 1

    @property
    def pending(self) -> bool:
        """Some offset completed by a Kafka transaction whose outcome is not known yet."""
        return bool(self._pending)

    def settled(self, offset: int) -> None:
        """The Kafka transaction that completed `offset` committed: no abort reopens it now."""
        self._pending.discard(offset)

    def reopen(self, offset: int) -> None:
        """Undo complete(): the Kafka transaction that carried it aborted."""
        self._pending.discard(offset)
        self._completed_above.discard(offset)
        self._measured = self._full_at = None  # the low water may move down: measure again
        if offset not in self._incomplete:
            self._incomplete.add(offset)
            heapq.heappush(self._heap, offset)

    def lowest_incomplete(self, n: int) -> list[int]:
        """The `n` lowest offsets fetched and not completed, ascending (core/receive/expired_heads.py)."""
        return heapq.nsmallest(n, self._incomplete)

    def low_water(self) -> int:
        while self._heap and self._heap[0] not in self._incomplete:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else self._high

    def commit_position(self) -> tuple[int, str]:
        """(offset to commit, metadata listing completed offsets above it)."""
        pos = self.low_water()
        above = [o for o in self._completed_above if o > pos]
        # Completed offsets below the position need no memory once no abort can bring the
        # position back under them. An abort reopens only offsets its transaction completed, so
        # the position can fall back to the lowest of those still pending, no further. (Forgotten
        # at the position itself, they were missing from the metadata of the next commit after
        # such an abort, and the next owner delivered them again: a duplicate seen under
        # rebalances, whose refused commits abort transactions.)
        floor = min(pos, min(self._pending, default=pos))
        self._completed_above = {o for o in self._completed_above if o >= floor}
        self._skip = {o for o in self._skip if o >= floor}
        metadata = encode_completed(pos, above)
        self._measured = (len(metadata), self._completions)
        return pos, metadata

    def metadata_room(self) -> bool:
        """False when the metadata nears Kafka's limit: stop handing out records above the
        low-water mark until it moves (back-pressure instead of a failed commit)."""
        if len(self._completed_above) < _SURELY_FITS:
            return True  # cheap answer on the RECEIVE path: no encoding needed
        # Every RECEIVE asks, and encoding thousands of offsets each time cost a drain a third of
        # its reader's time. Since the last measurement, the low water only rose (which drops
        # offsets and never lengthens the encoding) and each completion added at most
        # _GROWTH_PER_OFFSET bytes; measure again only when that bound reaches the margin.
        limit = METADATA_LIMIT - _ROOM_MARGIN - HOLDER_ROOM  # the committer adds the holder
        if self._measured is not None:
            size, at = self._measured
            if size + (self._completions - at) * _GROWTH_PER_OFFSET < limit:
                return True
        pos = self.low_water()
        if self._full_at == (pos, self._completions):
            return False  # still full: nothing completed and the low water did not move
        size = len(encode_completed(pos, [o for o in self._completed_above if o > pos]))
        self._measured = (size, self._completions)
        self._full_at = None if size < limit else (pos, self._completions)
        return self._full_at is None


def caught_up(owned: Collection[int], at_end: Collection[int]) -> bool:
    """Whether a receiver has read to the end every partition it owns (and owns one): only then
    does an empty RECEIVE mean the queue holds nothing for it."""
    return bool(owned) and set(at_end) >= set(owned)
