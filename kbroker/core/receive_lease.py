"""What ending, splitting or losing a RECEIVE lease does to its records and offsets (pure: no
Kafka client, no threads, no clock; the receiver calls these under its own lock).

A lease is the records one transaction took from one conversation group and the queue offsets
they complete. Its commit completes those offsets and commits each touched partition at its
low-water mark (with the completed offsets above it as metadata, core/offsets.py); an aborted
Kafka transaction reopens them; a rollback puts the records back at the head of their group,
unless their partition went to another process, which then reads them itself.
"""

from __future__ import annotations

from typing import Collection, Iterable, Mapping, Sequence

from kbroker.core.group_buffer import Buffered, Position
from kbroker.core.offsets import PartitionOffsets


def lost_partition(positions: Iterable[Position], owned: Collection[int]) -> bool:
    """Whether a lease over `positions` completes an offset of a partition this process no
    longer owns: its commit would overlap the next owner's, so the lease is doomed."""
    return any(p not in owned for p, _ in positions)


def completed(offsets: Mapping[int, PartitionOffsets], positions: Iterable[Position]) -> list[tuple[int, int, str]]:
    """Complete `positions` (every partition owned) and return what to commit for each partition
    they touch, in partition order: (partition, offset, metadata)."""
    touched: set[int] = set()
    for p, off in positions:
        offsets[p].complete(off)
        touched.add(p)
    out = []
    for p in sorted(touched):
        pos, meta = offsets[p].commit_position()
        out.append((p, pos, meta))
    return out


def reopened(offsets: Mapping[int, PartitionOffsets], positions: Iterable[Position]) -> None:
    """Undo completed() for `positions` whose partition is still owned: the Kafka transaction
    that carried them aborted."""
    for p, off in positions:
        if p in offsets:
            offsets[p].reopen(off)


def returned(taken: Sequence[Buffered], committed: bool, doomed: bool, owned: Collection[int]) -> list[Buffered]:
    """The records a lease puts back at the head of its group when it ends: none once committed
    or doomed, else those of partitions still owned (the next owner reads the others)."""
    if committed or doomed:
        return []
    return [b for b in taken if b.partition in owned]


def split_off(taken: Sequence[Buffered], offsets: Sequence[Position], moved: Collection[Position]
              ) -> tuple[tuple[list[Buffered], list[Position]], tuple[list[Buffered], list[Position]]]:
    """A lease's records and offsets split into those it keeps and those at `moved` (which then
    commit on their own: the re-keying of a moved conversation), each in its order."""
    kept = ([b for b in taken if b.position not in moved], [o for o in offsets if o not in moved])
    split = ([b for b in taken if b.position in moved], [o for o in offsets if o in moved])
    return kept, split
