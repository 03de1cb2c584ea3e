"""The RECEIVE rule that keeps commit metadata under Kafka's 4 KiB limit: once a partition's
completed-above-the-low-water list nears it, only the low-water record is handed out."""

import itertools
import random
import threading
from collections import OrderedDict, deque

from kbroker.core.envelope import Envelope
from kbroker.core.offsets import PartitionOffsets
from kbroker.kafka.receiver import Buffered, QueueReceiver


class FakeRecord:
    def __init__(self, partition, offset):
        self._p, self._o = partition, offset

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def timestamp(self):
        return (0, self._o)

    def value(self):
        return b""


def receiver_with(tracker, records):
    """A QueueReceiver's picking state without a consumer or poll thread."""
    r = object.__new__(QueueReceiver)
    r.queue, r._cv, r._locked, r._buffered = "Q", threading.Condition(), {}, 0
    r._offsets, r._groups = {0: tracker}, OrderedDict()
    r._ready, r._ready_seq = [], itertools.count()
    for group, off, priority in records:
        env = Envelope("m%d" % off, group, group, 0, "T", "C", "F", "S", "TARGET", priority=priority)
        q = r._groups.setdefault(group, deque())
        q.append(Buffered(env, FakeRecord(0, off)))
        r._buffered += 1
        if len(q) == 1:
            r._mark(group, q)
    return r


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
    r = receiver_with(tracker, [("low", 0, 5), ("low", newer + 1, 5), ("newer", newer, 10)])
    tracker.fetched(newer + 1)
    # "newer" outranks by priority but sits above the low-water mark: refused.
    assert r._pick(object(), None, None) == "low"
    lease, msgs = r._take(object(), "low", 10, None)
    assert [m.offset for m in msgs] == [0], "only the low-water record while the metadata is full"
    # Once the low-water record completes, the committed offset moves and the rest flows.
    tracker.complete(0)
    tracker.commit_position()
    assert tracker.metadata_room()
    assert r._pick(object(), None, None) in ("low", "newer")


def test_room_left_picks_by_priority_then_age():
    tracker = PartitionOffsets(committed=0)
    for o in (0, 1, 2):
        tracker.fetched(o)
    r = receiver_with(tracker, [("a", 1, 5), ("b", 0, 5), ("a", 2, 5)])
    assert r._pick(object(), None, None) == "b"
