"""The RECEIVE rule that keeps commit metadata under Kafka's 4 KiB limit: once a partition's
completed-above-the-low-water list nears it, only the low-water record is handed out."""

from __future__ import annotations

import random

from kbroker.core.envelope import Envelope
from kbroker.core.group_buffer import Buffered, GroupBuffer, full_partitions
from kbroker.core.offsets import PartitionOffsets

NOW_MS = 10**12


class FakeRecord:
    def value(self) -> bytes:
        return b""


class FakeLease:
    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.taken: list[Buffered] = []


def buffer_with(records: list[tuple[str, int, int]]) -> GroupBuffer[FakeLease]:
    """A buffer of (group, offset, priority) records, all of partition 0, aged by offset."""
    buf: GroupBuffer[FakeLease] = GroupBuffer()
    for group, off, priority in records:
        env = Envelope("m%d" % off, group, group, 0, "T", "C", "F", "S", "TARGET", priority=priority)
        buf.accept(Buffered(env, FakeRecord(), 0, off, off))
    return buf


def test_full_metadata_hands_out_only_the_low_water_record():
    rng = random.Random(3)
    tracker = PartitionOffsets(committed=0)
    tracker.fetched(0)  # held by a slow reader: the low-water mark
    off = 0
    while tracker.metadata_room():
        off += rng.randint(1, 5000)
        tracker.fetched(off)
        tracker.complete(off)
    newer = off + 1
    tracker.fetched(newer)
    buf = buffer_with([("low", 0, 5), ("low", newer + 1, 5), ("newer", newer, 10)])
    tracker.fetched(newer + 1)
    offsets = {0: tracker}
    full = full_partitions(offsets)
    assert full == {0: 0}
    # "newer" outranks by priority but sits above the low-water mark: refused.
    owner = object()
    assert buf.pick(owner, full) == "low"
    taken = buf.take(FakeLease(owner), "low", 10, full, NOW_MS)
    assert [b.offset for b in taken] == [0], "only the low-water record while the metadata is full"
    # Once the low-water record completes, the committed offset moves and the rest flows.
    tracker.complete(0)
    tracker.commit_position()
    assert tracker.metadata_room()
    assert full_partitions(offsets) == {}
    assert buf.pick(object(), full_partitions(offsets)) == "newer"  # priority 10 first again


def test_room_left_picks_by_priority_then_age():
    tracker = PartitionOffsets(committed=0)
    for o in (0, 1, 2):
        tracker.fetched(o)
    buf = buffer_with([("a", 1, 5), ("b", 0, 5), ("a", 2, 5)])
    assert buf.pick(object(), full_partitions({0: tracker})) == "b"
