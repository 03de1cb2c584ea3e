"""The leases of a queue's buffered records: which transaction has taken what, until it ends.

A RECEIVE leases one ready, unlocked conversation group (core/receive/group_buffer.py picks it) and takes
up to TOP(n) of its records. A lease ends when its transaction commits (its offsets complete and
are committed with it) or rolls back (its records go back, in order, to the head of the group).
When a rebalance revokes partitions, the leases on them get `revoke_grace` seconds to be carried
by a Kafka transaction; the rest are doomed (their commit fails and nothing they did becomes
visible), so the next owner never overlaps them. The rules are core/receive/receive_lease.py's.

Part of kafka/receive/receiver.QueueReceiver, which holds the one lock (`cv`) all its parts share.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from confluent_kafka import Message as KafkaRecord
from confluent_kafka import TopicPartition

from kbroker.core.receive.expired_heads import expired_head, head_settled
from kbroker.core.receive.group_buffer import Buffered, GroupBuffer, full_partitions, receive_order
from kbroker.core.receive.receive_lease import (
    completed,
    lost_partition,
    reopened,
    returned,
    rolled_back_to,
    settled,
    split_off,
)
from kbroker.kafka import messages
from kbroker.kafka.receive.partition_assignment import PartitionAssignment


class LeaseHolder(Protocol):
    """What a lease names as its receiver (kafka/receive/receiver.QueueReceiver): the committer and the
    transactions reach the receiver's offsets and buffer through it."""

    topic: str
    queue: str

    def include(self, leases: list["Lease"]) -> list[TopicPartition] | None: ...

    def exclude(self, leases: list["Lease"]) -> None: ...

    def release(self, lease: "Lease", committed: bool) -> None: ...

    def give_back(self, lease: "Lease", keep: int) -> None: ...

    def group_metadata(self) -> Any: ...


@dataclass(eq=False)
class Lease:
    """The records one transaction took from one conversation group (or dead-lettered)."""

    receiver: "LeaseHolder"
    group: str | None
    owner: Any
    taken: list[Buffered] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) to complete
    doomed: bool = False
    included: bool = False  # carried by a Kafka transaction under way
    # Each partition's tracker when the records were fetched (core/receive/receive_lease.py: a lease
    # outliving its partition's assignment completes, reopens and puts back nothing).
    assignments: dict[int, Any] = field(default_factory=dict)
    # The group's partition: a revocation of it settles the lease even before it takes a record
    # (GET CONVERSATION GROUP, a statement's group lock), so the next owner never serves the
    # group while this lease's transaction may still commit.
    partition: int | None = None

    @property
    def partitions(self) -> set[int]:
        """The partitions of the offsets this lease completes."""
        return {p for p, _ in self.offsets}


class LeaseBook:
    """The leases of one receiver (`receiver`, which every lease names) over its buffer and the
    partitions its assignment owns, all guarded by `cv`. `closed` says the receiver is closing:
    a RECEIVE waiting here then returns empty."""

    def __init__(
        self,
        receiver: "LeaseHolder",
        buffer: GroupBuffer[Lease],
        assignment: PartitionAssignment,
        cv: threading.Condition,
        *,
        revoke_grace: float,
        closed: Callable[[], bool],
        refused: Callable[[], Exception | None] = lambda: None,
    ):
        self._receiver, self._buffer, self._assignment, self._cv = receiver, buffer, assignment, cv
        self._revoke_grace, self._closed = revoke_grace, closed
        self._refused = refused  # the authorizer's refusal the poll thread met, if it stands
        # Who waits on cv (guarded by it): RECEIVEs that take any group, and everyone else (a
        # RECEIVE for one group or conversation, a count of what waits, a revocation waiting for
        # its leases). wake() wakes only as many of the first as there is new work for, unless
        # one of the others waits: waking every waiter on each poll and each commit cost a
        # process of 64 readers 64 wake-ups a time, most of them for nothing.
        self._takers = 0
        self._others = 0

    def waiting(self) -> int:
        """Records buffered here and not taken: what a monitoring loop counts as waiting."""
        with self._cv:
            return self._buffer.buffered

    def wait_for_waiting(self, timeout: float) -> int:
        """Wait up to `timeout` s for a buffered record not taken yet; returns how many there are."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._buffer.buffered and not self._closed():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait(min(left, 0.5), taker=False)
            return self._buffer.buffered

    def wake(self, work: int) -> None:
        """There is new work for up to `work` RECEIVEs: records buffered, a group unlocked
        (called under cv). Wakes that many of the RECEIVEs that take any group, or every waiter
        when one of another kind waits (it may be the one the change is for)."""
        if self._others or work >= self._takers:
            self._cv.notify_all()
        elif work > 0:
            self._cv.notify(work)

    def _wait(self, seconds: float, *, taker: bool) -> None:
        """cv.wait, counted as a taker's wait or another's (called under cv)."""
        if taker:
            self._takers += 1
        else:
            self._others += 1
        try:
            self._cv.wait(seconds)
        finally:
            if taker:
                self._takers -= 1
            else:
                self._others -= 1

    def quiet(self) -> bool:
        """No group leased, and no completed offset waiting for its Kafka transaction's outcome
        (called under cv)."""
        return not self._buffer.holders() and not any(o.pending for o in self._assignment.offsets.values())

    def take(
        self,
        owner: Any,
        top: int,
        wait: float | None,
        *,
        conversation_group: str | None = None,
        conversation_id: str | None = None,
        give_up: Callable[[], bool] = lambda: False,
        settled: bool = True,
    ) -> tuple[Lease | None, list[Buffered], int]:
        """QueueReceiver.take: the lease, the live records taken in RECEIVE order, and how many
        expired ones were taken with them."""
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        catch_up_deadline = start + max(wait or 0.0, 30.0)
        with self._cv:
            while True:
                if self._closed():
                    return None, [], 0
                refused = self._refused()
                if refused is not None:
                    raise refused  # not waited out: it stands until an operator grants the ACL
                full = full_partitions(self._assignment.offsets)
                group = self._buffer.pick(owner, full, conversation_group, conversation_id)
                if group is not None:
                    return self._take(owner, group, top, full, conversation_id)
                now = time.monotonic()
                if deadline is not None and now >= deadline and (self._settled(settled) or now >= catch_up_deadline):
                    return None, [], 0
                if give_up():
                    return None, [], 0
                self._wait(
                    0.5 if deadline is None else max(min(deadline - now, 0.5), 0.01),
                    taker=conversation_group is None and conversation_id is None,
                )

    def _settled(self, now: bool) -> bool:
        """Whether an empty take may return: every partition owned read to its end (`now`: with
        nothing fetched since; else at least once since it was given to this process)."""
        return self._assignment.caught_up() if now else self._assignment.read_once()

    def _take(
        self, owner: Any, group: str, top: int, full: dict[int, int], conversation_id: str | None
    ) -> tuple[Lease, list[Buffered], int]:
        lease = self._buffer.holder(group) or Lease(self._receiver, group, owner)
        if lease.partition is None:
            lease.partition = self._buffer.partition(group)
        now_ms = int(time.time() * 1000)
        taken = self._buffer.take(lease, group, top, full, now_ms, conversation_id)
        lease.taken.extend(taken)
        lease.offsets.extend(b.position for b in taken)
        for b in taken:
            lease.assignments.setdefault(b.partition, b.assignment)
        live = [b for b in receive_order(taken) if b.live(now_ms)]
        return lease, live, len(taken) - len(live)

    def take_expired_heads(
        self, owner: Any, now_ms: int, limit: int, wait: float
    ) -> tuple[list[Lease], list[int] | None]:
        """QueueReceiver.take_expired_heads: one lease per record taken, and the partitions not
        settled yet (None before the group first assigned this process anything)."""
        with self._cv:
            leases, unsettled = self._expired_heads(owner, now_ms, limit)
            if not leases and unsettled != [] and wait > 0:
                self._wait(wait, taker=False)  # woken by the poll thread's next records
                leases, unsettled = self._expired_heads(owner, now_ms, limit)
            return leases, unsettled

    def _expired_heads(self, owner: Any, now_ms: int, limit: int) -> tuple[list[Lease], list[int] | None]:
        """Take, under cv, each owned partition's expired head (core/receive/expired_heads.py)
        over the records of its current assignment that head an unlocked group."""
        if self._closed():
            return [], []
        refused = self._refused()
        if refused is not None:
            raise refused
        assignment = self._assignment
        if not assignment.assigned_once:
            return [], None
        owned = assignment.offsets
        available: dict[int, dict[int, tuple[str, Buffered]]] = {p: {} for p in owned}
        for group, b in self._buffer.unlocked_heads().items():
            if b.partition in owned and b.assignment is owned[b.partition]:
                available[b.partition][b.offset] = (group, b)
        leases: list[Lease] = []
        unsettled = list(assignment.waiting)  # assigned, their committed offsets not read yet
        for p, tracker in sorted(owned.items()):
            room = limit - len(leases)
            records = {off: b for off, (_group, b) in available[p].items()}
            taken, head = expired_head(tracker.lowest_incomplete(room + 1), records, now_ms, room)
            for b in taken:
                group = available[p][b.offset][0]
                lease = Lease(self._receiver, group, owner, assignments={p: tracker})
                lease.taken.append(self._buffer.take_head(lease, group, now_ms))
                lease.offsets.append(b.position)
                leases.append(lease)
            if not head_settled(head, len(taken), assignment.at_end(p)):
                unsettled.append(p)
        return leases, sorted(unsettled)

    def lock_group(self, owner: Any, group: str, timeout: float, partition: int | None = None) -> Lease | None:
        """QueueReceiver.lock_group: the lease locking `group` (of `partition`, where known) for
        `owner` (the one it holds already, or a new one that takes no record), waiting up to
        `timeout` s for another owner's to end; None when it did not."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                holder = self._buffer.holder(group)
                if holder is None:
                    lease = Lease(self._receiver, group, owner, partition=partition)
                    self._buffer.lock(lease, group, int(time.time() * 1000))
                    return lease
                if holder.owner is owner:
                    if holder.partition is None:
                        holder.partition = partition
                    return holder
                contended = getattr(holder.owner, "contended", None)
                if contended is not None:
                    contended()  # another process's hold (kafka/dialogs/group_holds.py): asked back
                left = deadline - time.monotonic()
                if left <= 0 or self._closed():
                    return None
                self._wait(min(left, 0.5), taker=False)  # release() wakes every such waiter

    def reserve_group(self, owner: Any, group: str) -> tuple[Lease, bool]:
        """QueueReceiver.reserve_group: a lease locking `group` for `owner` now (True) or as soon
        as its holder releases it (False)."""
        with self._cv:
            lease = Lease(self._receiver, group, owner)
            return lease, self._buffer.reserve(lease, group, int(time.time() * 1000))

    def holds(self, lease: Lease) -> bool:
        with self._cv:
            return lease.group is not None and self._buffer.holder(lease.group) is lease

    def unreserve(self, lease: Lease) -> None:
        with self._cv:
            if lease.group is not None:
                self._buffer.unreserve(lease, lease.group)

    def split(self, lease: Lease, offsets: list[tuple[int, int]]) -> Lease:
        """QueueReceiver.split: the records at `offsets` moved into a lease of their own."""
        with self._cv:
            side = Lease(self._receiver, lease.group, None, assignments=dict(lease.assignments))
            (lease.taken, lease.offsets), (side.taken, side.offsets) = split_off(
                lease.taken, lease.offsets, set(offsets)
            )
            return side

    def dead_letter_lease(self, rec: KafkaRecord) -> Lease:
        """A lease over one malformed record, completed when its dead letter commits."""
        p, off = messages.position(rec)
        return Lease(self._receiver, None, None, offsets=[(p, off)], assignments={p: self._assignment.offsets.get(p)})

    def include(self, leases: list[Lease]) -> list[TopicPartition] | None:
        """QueueReceiver.include: the positions to commit, or None when a lease was doomed."""
        with self._cv:
            owned = self._assignment.offsets
            for lease in leases:
                if lost_partition(lease.offsets, lease.assignments, owned):
                    lease.doomed = True  # its partition is gone: the next owner has it
            if any(lease.doomed for lease in leases):
                return None
            for lease in leases:
                lease.included = True
            positions = completed(owned, [o for lease in leases for o in lease.offsets])
            return [TopicPartition(self._assignment.topic, p, pos, metadata=meta) for p, pos, meta in positions]

    def exclude(self, leases: list[Lease]) -> None:
        """The Kafka transaction aborted: the offsets are incomplete again."""
        with self._cv:
            for lease in leases:
                lease.included = False
                reopened(self._assignment.offsets, lease.offsets, lease.assignments)

    def release(self, lease: Lease, committed: bool) -> None:
        """QueueReceiver.release: end a lease, its records back at the head of their group
        unless it committed or its partition was revoked."""
        with self._cv:
            if committed and lease.included:
                settled(self._assignment.offsets, lease.offsets, lease.assignments)
            if lease.group is not None:
                back = returned(lease.taken, committed, lease.doomed, self._assignment.offsets)
                self._buffer.release(lease, lease.group, back)
            self.wake(1)  # the group it unlocks, if records wait in it

    def give_back(self, lease: Lease, keep: int) -> None:
        """QueueReceiver.give_back: the lease's records after its first `keep` back at the head of
        their group, which stays locked by the lease."""
        with self._cv:
            (lease.taken, lease.offsets), back = rolled_back_to(lease.taken, lease.offsets, keep)
            if lease.group is not None:
                self._buffer.put_back(lease.group, returned(back, False, lease.doomed, self._assignment.offsets))

    def settle_revoked(self, revoked: set[int], since: float, *, lost: bool = False) -> None:
        """Partitions are revoked (called under cv, `since` the revocation began, monotonic): drop
        their buffered records, give the leases on them not yet carried by a Kafka transaction up
        to `revoke_grace` seconds to be, and doom the rest. Lost partitions (another member has
        them already) give no grace: a lease on them doomed now cannot overlap the next owner."""
        deadline = since if lost else since + self._revoke_grace
        self._buffer.drop_partitions(revoked)
        while True:
            at_risk = [
                lease
                for lease in self._buffer.holders()
                if (lease.partitions & revoked or lease.partition in revoked) and not lease.included
            ]
            if not at_risk or time.monotonic() >= deadline:
                break
            self._wait(deadline - time.monotonic(), taker=False)
        for lease in at_risk:
            lease.doomed = True

    def forget_revoked(self, revoked: set[int]) -> None:
        """The partitions are gone (called under cv): drop the records a transaction that failed
        while the revocation waited for it put back meanwhile."""
        self._buffer.drop_partitions(revoked)
