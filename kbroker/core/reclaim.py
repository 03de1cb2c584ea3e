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
(a position older than ANALYTICS_HOLD_SECONDS is a job that stopped, and holds nothing back).
"""

from __future__ import annotations

from collections.abc import Mapping

ANALYTICS_HOLD_SECONDS = 3600.0


def analytics_floor(positions: Mapping[int, tuple[int, str | None]], now_ms: int,
                    hold_s: float = ANALYTICS_HOLD_SECONDS) -> dict[int, int]:
    """Per partition, the offset the analytics job reads next, from its group's committed offsets
    (offset, metadata = the epoch ms it committed at): only recent ones hold records back."""
    floor = {}
    for partition, (offset, metadata) in positions.items():
        try:
            at = int(metadata or "")
        except ValueError:
            continue
        if offset >= 0 and now_ms - at <= hold_s * 1000:
            floor[partition] = offset
    return floor


def lowest(*floors: Mapping[int, int] | None) -> dict[int, int]:
    """Per partition, the lowest of the floors that name it."""
    out: dict[int, int] = {}
    for floor in floors:
        for partition, offset in (floor or {}).items():
            out[partition] = min(offset, out.get(partition, offset))
    return out


def reclaim_points(starts: Mapping[int, int], committed: Mapping[int, int | None],
                   keep_from: Mapping[int, int] | None = None) -> dict[int, int]:
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

