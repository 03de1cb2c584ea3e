"""Which records of a queue topic no reader needs any more (pure logic).

Queue topics keep every record: Kafka deletes nothing by age or size (G3: a message waits for
its reader however long that takes). Disk is reclaimed the way Service Broker's 5th-tick cleanup
and Kafka Streams' repartition-topic purge do it: the worker deletes the records below the
offset each partition's readers still need (the Admin API's delete-records), once per cluster on
every 5th tick.

What a partition's readers still need starts at the queue group's committed offset: every
record below it was received by a committed transaction (completed offsets above it are not
deleted: the log only ever loses a prefix). A partition nobody has committed on keeps
everything. RETENTION = ON keeps received messages until their conversation ends, so on such a
queue the prefix stops at the first record of a conversation this side has not ended.

The analytics job (docs/analytics.md) counts arrivals by reading the queue topics, so what it has
not read yet is kept too: its group's committed offsets lower the points, as long as it commits
(a position older than ANALYTICS_HOLD_SECONDS is a job that stopped, and holds nothing back), and
while it runs a partition it has no position for is kept whole.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

ANALYTICS_HOLD_SECONDS = 3600.0
# A position stamped later than now by more than this is not the job's (its clock and the worker's
# differ by less): anyone who may commit for the job's group could otherwise hold every record for
# ever with a stamp in the future.
CLOCK_SKEW_SECONDS = 300.0
K = TypeVar("K", bound=Hashable)


def analytics_floor(
    positions: Mapping[K, tuple[int, str | None]], now_ms: int, hold_s: float = ANALYTICS_HOLD_SECONDS
) -> dict[K, int]:
    """Per partition asked (any key: a partition, or a topic and partition), the offset the
    analytics job reads next, from its group's committed offsets (offset, metadata = the epoch
    ms it committed at; offset -1 when it has none). Only recent positions hold records back.

    While the job runs (a recent position on any partition asked), a partition it has no recent
    position for keeps everything (floor 0): a queue its Spark source has not found yet, or one
    it found but has not committed a position for (its first batch knows no end offsets). Those
    records were reclaimed under the job, which never counted them."""
    recent = recent_positions(positions, now_ms, hold_s)
    if not recent:
        return {}
    return {key: recent.get(key, 0) for key in positions}


def recent_positions(
    positions: Mapping[K, tuple[int, str | None]], now_ms: int, hold_s: float = ANALYTICS_HOLD_SECONDS
) -> dict[K, int]:
    """The positions (offset, metadata = the epoch ms it committed at) committed within `hold_s`
    (and not stamped in the future past the clocks' skew)."""
    recent = {}
    for key, (offset, metadata) in positions.items():
        try:
            at = int(metadata or "")
        except ValueError:
            continue
        if offset >= 0 and -CLOCK_SKEW_SECONDS * 1000 <= now_ms - at <= hold_s * 1000:
            recent[key] = offset
    return recent


def lowest(*floors: Mapping[int, int] | None) -> dict[int, int]:
    """Per partition, the lowest of the floors that name it."""
    out: dict[int, int] = {}
    for floor in floors:
        for partition, offset in (floor or {}).items():
            out[partition] = min(offset, out.get(partition, offset))
    return out


def reclaim_points(
    starts: Mapping[int, int], committed: Mapping[int, int | None], keep_from: Mapping[int, int] | None = None
) -> dict[int, int]:
    """Per partition, the offset to delete records below, for the partitions where it is above
    the log start: the committed offset, lowered to `keep_from` (the first record a retained
    conversation still needs). A partition without a commit keeps everything."""
    points = {}
    for partition, start in starts.items():
        upto = committed.get(partition)
        if upto is None or upto < 0:
            continue
        if keep_from and partition in keep_from:
            upto = min(upto, keep_from[partition])
        if upto > start:
            points[partition] = upto
    return points
