"""What ending, splitting or losing a RECEIVE lease does to its records and offsets (pure: no
Kafka client, no threads, no clock; the receiver calls these under its own lock).

A lease is the records one transaction took from one conversation group and the queue offsets
they complete. Its commit completes those offsets and commits each touched partition at its
low-water mark (with the completed offsets above it as metadata, core/receive/offsets.py); an aborted
Kafka transaction reopens them; a rollback puts the records back at the head of their group,
unless their partition went to another process, which then reads them itself.

A lease knows the assignment (the partition's tracker) its records were fetched under. A partition
revoked and assigned again is read anew from its committed offsets, so a lease of the earlier
assignment, ending after that, must neither put its copies back nor complete or reopen offsets
of the new tracker: either delivered the same messages twice.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence

from kbroker.core.receive.group_buffer import Buffered, Position
from kbroker.core.receive.offsets import PartitionOffsets


def current(offsets: Mapping[int, PartitionOffsets], partition: int, assignment: Any) -> bool:
    """Whether `assignment` (a tracker a record was fetched under) is `partition`'s current one."""
    tracker = offsets.get(partition)
    return tracker is not None and tracker is assignment


def lost_partition(
    positions: Iterable[Position], assignments: Mapping[int, Any], offsets: Mapping[int, PartitionOffsets]
) -> bool:
    """Whether a lease over `positions` (fetched under `assignments`) completes an offset of a
    partition this process no longer owns, or owns again under a new assignment: its commit
    would overlap the next owner's or deliver twice, so the lease is doomed."""
    return any(not current(offsets, p, assignments.get(p)) for p, _ in positions)


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


def _owned(
    offsets: Mapping[int, PartitionOffsets], positions: Iterable[Position], assignments: Mapping[int, Any]
) -> Iterator[tuple[PartitionOffsets, int]]:
    """(tracker, offset) for `positions` whose partition is still owned under the assignment
    they were fetched under."""
    return ((offsets[p], off) for p, off in positions if current(offsets, p, assignments.get(p)))


def settled(
    offsets: Mapping[int, PartitionOffsets], positions: Iterable[Position], assignments: Mapping[int, Any]
) -> None:
    """The Kafka transaction that completed `positions` committed: no abort reopens them now."""
    for tracker, off in _owned(offsets, positions, assignments):
        tracker.settled(off)


def reopened(
    offsets: Mapping[int, PartitionOffsets], positions: Iterable[Position], assignments: Mapping[int, Any]
) -> None:
    """Undo completed() for `positions` whose partition is still owned under the assignment
    they were fetched under: the Kafka transaction that carried them aborted."""
    for tracker, off in _owned(offsets, positions, assignments):
        tracker.reopen(off)


def returned(
    taken: Sequence[Buffered], committed: bool, doomed: bool, offsets: Mapping[int, PartitionOffsets]
) -> list[Buffered]:
    """The records a lease puts back at the head of its group when it ends: none once committed
    or doomed, else those fetched under their partition's current assignment (the next owner,
    or the next assignment here, reads the others)."""
    if committed or doomed:
        return []
    return [b for b in taken if current(offsets, b.partition, b.assignment)]


def split_off(
    taken: Sequence[Buffered], offsets: Sequence[Position], moved: Collection[Position]
) -> tuple[tuple[list[Buffered], list[Position]], tuple[list[Buffered], list[Position]]]:
    """A lease's records and offsets split into those it keeps and those at `moved` (which then
    commit on their own: the re-keying of a moved conversation), each in its order."""
    kept = ([b for b in taken if b.position not in moved], [o for o in offsets if o not in moved])
    split = ([b for b in taken if b.position in moved], [o for o in offsets if o in moved])
    return kept, split


def rolled_back_to(
    taken: Sequence[Buffered], offsets: Sequence[Position], keep: int
) -> tuple[tuple[list[Buffered], list[Position]], list[Buffered]]:
    """A lease's records and offsets once its transaction rolls back to a savepoint taken when
    the lease held its first `keep` records (records are only ever added after those, or split
    off from what came after): ((the records and offsets it keeps), the records it gives back,
    in the order taken)."""
    back = list(taken[keep:])
    gone = {b.position for b in back}
    return (list(taken[:keep]), [o for o in offsets if o not in gone]), back
