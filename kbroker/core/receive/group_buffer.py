"""The records a queue's receiver holds, per conversation group, and RECEIVE's choice among them
(pure: no Kafka client, no threads, no clock; the receiver calls it under its own lock).

Each conversation group keeps its buffered records in a deque, in arrival order, except that a
DialogTimer comes before the group's other messages and kbroker's own Error (a lifetime's) next,
as Service Broker hands them out; receive_order() then returns what one RECEIVE took conversation by conversation.
A RECEIVE picks one ready group (highest priority of its head record first, then the oldest head)
that no other transaction has locked, locks it and takes up to TOP(n) of its records; a rollback
puts them back at the head, in order.

Picking must not scan every buffered group (on a large backlog that scan was most of the poll
process's time), so ready groups sit in a heap keyed by their head record. Entries go stale when
a group's head changes or it is locked; stale ones are dropped when they surface, and every new
head is pushed again.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Collection, Generic, Mapping, Protocol, Sequence, TypeVar

from kbroker.core.catalog.models import DIALOG_TIMER, ERROR
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE, Envelope
from kbroker.core.receive.offsets import PartitionOffsets

# Service Broker hands a dialog's DialogTimer out before its other messages, then the broker's own
# Error (a lifetime's), whenever they arrived. The far side's Error (END CONVERSATION WITH ERROR)
# is the last of what that side sent: ahead of its earlier messages it would end the dialog here
# before them, and they would be set aside as sent after the end. It and the rest keep arrival order.
_FIRST = {DIALOG_TIMER: 0, ERROR: 1}
_IN_ARRIVAL_ORDER = 2

Order = tuple[int, int, int]  # (-priority, enqueued ms, offset): smaller is received first
Position = tuple[int, int]  # (partition, offset)


class SourceRecord(Protocol):
    """The consumed record a Buffered carries for the receiver (confluent-kafka's Message is
    one); the buffer itself reads only the fields copied into Buffered."""

    def value(self) -> bytes | None: ...


@dataclass(slots=True, eq=False)
class Buffered:
    """One buffered message: its envelope, its record, and what ordering needs, read once."""

    envelope: Envelope
    record: SourceRecord
    partition: int
    offset: int
    enqueued_ms: int  # the record's timestamp: the message's age
    # The receiver's tracker of the partition when the record was fetched: a record of an
    # earlier assignment of its partition is never put back nor committed (its next owner, or
    # this process's next assignment, reads it again).
    assignment: Any = None
    order: Order = field(init=False)
    position: Position = field(init=False)
    rank: int = field(init=False)  # DialogTimer 0, kbroker's own Error 1, the rest in arrival order

    def __post_init__(self) -> None:
        self.order = (-self.envelope.priority, self.enqueued_ms, self.offset)
        self.position = (self.partition, self.offset)
        system = self.envelope.message_sequence_number == SYSTEM_SEQUENCE
        self.rank = _FIRST.get(self.envelope.message_type_name, _IN_ARRIVAL_ORDER) if system else _IN_ARRIVAL_ORDER

    def live(self, now_ms: int) -> bool:
        """Not expired: an expired message is consumed by RECEIVE but not returned."""
        expires = self.envelope.expires
        return expires is None or expires > now_ms


class Holder(Protocol):
    """What locks a group: the lease of one transaction (its owner) and what it took."""

    @property
    def owner(self) -> Any: ...

    @property
    def taken(self) -> Sequence[Buffered]: ...


H = TypeVar("H", bound=Holder)


def full_partitions(offsets: Mapping[int, PartitionOffsets]) -> dict[int, int]:
    """Partitions whose commit metadata nears Kafka's limit, with their low-water offset: they
    hand out only their oldest incomplete record until it completes and the committed offset
    moves past the rest."""
    return {p: t.low_water() for p, t in offsets.items() if not t.metadata_room()}


def pause_change(paused: bool, buffered: int, max_buffered: int) -> bool | None:
    """Back-pressure on the consumer: True to pause it (`max_buffered` records wait here), False
    to resume it (down to half of that), None to leave it as it is. Pausing at the bound and
    resuming only at half keeps it from flapping on every RECEIVE."""
    if not paused and buffered >= max_buffered:
        return True
    if paused and buffered <= max_buffered // 2:
        return False
    return None


def _blocked(q: deque[Buffered], full: Mapping[int, int]) -> bool:
    """A group whose partition hands out only its low-water record, which this group lacks."""
    head = q[0]
    low = full.get(head.partition)
    return low is not None and head.offset != low and all(b.offset != low for b in q)


def _enqueue(q: deque[Buffered], b: Buffered) -> None:
    """Append in RECEIVE order: after the group's records of the same or an earlier rank."""
    if b.rank == _IN_ARRIVAL_ORDER:
        q.append(b)
        return
    i = 0
    while i < len(q) and q[i].rank <= b.rank:
        i += 1
    q.insert(i, b)


def receive_order(taken: Sequence[Buffered]) -> list[Buffered]:
    """What one RECEIVE took, in the order Service Broker returns it: each conversation's
    messages together, in ascending sequence (its DialogTimer, then an Error, first);
    conversations by descending priority (a conversation's highest), then by which came first.
    A conversation here is one side's: the group may hold both sides of a dialog whose services
    share a queue, and each side numbers its own SENDs."""
    rank: dict[tuple[str, str], tuple[int, int]] = {}
    for i, b in enumerate(taken):
        side = (b.envelope.conversation_id, b.envelope.to_side)
        prio, first = rank.get(side, (0, i))
        rank[side] = (min(prio, -b.envelope.priority), first)

    def key(b: Buffered) -> tuple[int, int, int, int]:
        prio, first = rank[(b.envelope.conversation_id, b.envelope.to_side)]
        return prio, first, b.rank, b.envelope.message_sequence_number

    return sorted(taken, key=key)


class GroupBuffer(Generic[H]):
    """Buffered records per conversation group, the ready heap, and the group locks."""

    def __init__(self) -> None:
        self._groups: OrderedDict[str, deque[Buffered]] = OrderedDict()
        # (head order, push sequence, group, head position): the position tells a stale entry
        # (the head has changed since) from a current one.
        self._ready: list[tuple[Order, int, str, Position]] = []
        self._ready_seq = itertools.count()
        self._locked: dict[str, H] = {}
        self._locked_since: dict[str, int] = {}  # group -> epoch ms its lock was taken (diagnosis)
        # The groups each owner locks, by id(owner) (an owner with a lock is alive: its lease
        # holds it): pick() looks at the picking owner's own groups without walking every lock.
        self._owned: dict[int, dict[str, None]] = {}  # insertion-ordered, as the locks are
        # group -> the holder that locks it as soon as its current holder releases it: another
        # process's hold (kafka/dialogs/group_holds.py), which would rarely find a busy group free.
        self._reserved: dict[str, H] = {}
        self._buffered = 0

    @property
    def buffered(self) -> int:
        """Records buffered and not taken (the back-pressure count)."""
        return self._buffered

    def holder(self, group: str) -> H | None:
        """The lease that locks `group`, if any."""
        return self._locked.get(group)

    def holders(self) -> list[H]:
        """Every lease that locks a group."""
        return list(self._locked.values())

    def has(self, group: str) -> bool:
        return bool(self._groups.get(group))

    def partition(self, group: str) -> int | None:
        """The partition `group`'s buffered records come from (None: none buffered)."""
        q = self._groups.get(group)
        return q[0].partition if q else None

    def records(self, group: str) -> list[Buffered]:
        """The group's buffered records in RECEIVE order (a copy)."""
        return list(self._groups.get(group, ()))

    def stats(self) -> dict[str, int | None]:
        """Counts for the queue view: buffered records, ready and locked groups, records taken,
        and when the oldest lock still held was taken (epoch ms, None: no lock)."""
        return {
            "buffered": self._buffered,
            "ready_groups": sum(1 for g in self._groups if g not in self._locked),
            "locked_groups": len(self._locked),
            "in_flight": sum(len(h.taken) for h in self._locked.values()),
            "oldest_lock_at": min(self._locked_since.values(), default=None),
        }

    def accept(self, b: Buffered) -> None:
        """Buffer a consumed record in its group."""
        group = b.envelope.conversation_group_id
        q = self._groups.get(group)
        if q is None:
            q = self._groups[group] = deque()
        _enqueue(q, b)
        self._buffered += 1
        if q[0] is b:
            self._mark(group, q)

    def _mark(self, group: str, q: deque[Buffered]) -> None:
        """The group's head changed (or it was unlocked): index it under its new head."""
        head = q[0]
        heapq.heappush(self._ready, (head.order, next(self._ready_seq), group, head.position))
        if len(self._ready) > 4 * len(self._groups) + 1024:  # mostly stale: rebuild
            self._ready = [
                (g[0].order, next(self._ready_seq), name, g[0].position)
                for name, g in self._groups.items()
                if name not in self._locked
            ]
            heapq.heapify(self._ready)

    def pick(
        self, owner: Any, full: Mapping[int, int], group: str | None = None, conversation: str | None = None
    ) -> str | None:
        """The group a RECEIVE by `owner` takes: highest priority, then oldest head record, among
        the unlocked groups and those `owner` already locks (which win a tie). `full` is
        full_partitions(): there only a group holding the low-water record can be taken."""
        if group is not None or conversation is not None:
            return self._scan(owner, full, group, conversation)
        best: str | None = None
        best_key: Order | None = None
        for name in self._owned.get(id(owner), ()):  # this transaction's own groups may give more
            q = self._groups.get(name)
            if q and not _blocked(q, full):
                key = q[0].order
                if best_key is None or key < best_key:
                    best, best_key = name, key
        aside = []
        while self._ready:
            key, _, name, head = self._ready[0]
            q = self._groups.get(name)
            if not q or q[0].position != head or name in self._locked:
                heapq.heappop(self._ready)  # stale, or locked (its release indexes it again)
                continue
            if _blocked(q, full):
                aside.append(heapq.heappop(self._ready))
                continue
            if best_key is None or key < best_key:
                best = name  # its entry goes stale when take() changes the head
            break
        for entry in aside:
            heapq.heappush(self._ready, entry)
        return best

    def _scan(self, owner: Any, full: Mapping[int, int], group: str | None, conversation: str | None) -> str | None:
        """RECEIVE ... WHERE conversation_group_id / conversation_handle = ...: a linear look."""
        best: str | None = None
        best_key: Order | None = None
        candidates = (
            self._groups.items() if group is None else ([(group, self._groups[group])] if group in self._groups else [])
        )
        for name, q in candidates:
            lease = self._locked.get(name)
            if lease is not None and lease.owner is not owner:
                continue  # the group lock: held by another transaction
            if conversation is not None and not any(b.envelope.conversation_id == conversation for b in q):
                continue
            if _blocked(q, full):
                continue
            key = q[0].order
            if best_key is None or key < best_key:
                best, best_key = name, key
        return best

    def take(
        self, holder: H, group: str, top: int, full: Mapping[int, int], now_ms: int, conversation: str | None = None
    ) -> list[Buffered]:
        """Lock `group` for `holder` (unless it holds it already) and take, from the head, records
        until `top` live ones (expired ones are taken too, not counted), only those of
        `conversation` if given; on a full partition (see pick) at most one. `group` is what
        pick() just returned for `holder`'s owner, and `holder` the lease already locking it if
        any. Returns the records taken, in order."""
        if self._locked.get(group) is not holder:
            self._locked[group] = holder
            self._locked_since.setdefault(group, now_ms)  # a lease handed on keeps the lock's age
            self._owned.setdefault(id(holder.owner), {})[group] = None
        q = self._groups.pop(group)
        if q[0].partition in full:
            top = min(top, 1)  # only the low-water record (see pick)
        kept: deque[Buffered] = deque()
        taken: list[Buffered] = []
        live = 0
        while q and live < top:
            b = q.popleft()
            if conversation is not None and b.envelope.conversation_id != conversation:
                kept.append(b)
                continue
            taken.append(b)
            if b.live(now_ms):
                live += 1
        self._buffered -= len(taken)
        kept.extend(q)
        if kept:
            self._groups[group] = kept
            self._groups.move_to_end(group, last=False)
            self._mark(group, kept)
        return taken

    def unlocked_heads(self) -> dict[str, Buffered]:
        """The head record of every group no transaction locks (a linear look: the start-up
        purge's, core/receive/expired_heads.py)."""
        return {name: q[0] for name, q in self._groups.items() if q and name not in self._locked}

    def lock(self, holder: H, group: str, now_ms: int) -> None:
        """Lock `group` (nobody locks it) for `holder` without taking a record: the group lock a
        statement on one of its conversations takes (core/dialogs/group_lock.py). Its records,
        buffered or to come, wait for release(); a RECEIVE by the same owner takes them."""
        self._locked[group] = holder
        self._locked_since.setdefault(group, now_ms)
        self._owned.setdefault(id(holder.owner), {})[group] = None

    def reserve(self, holder: H, group: str, now_ms: int) -> bool:
        """Lock `group` for `holder` now if nobody locks it (True), else as soon as its holder
        releases it, before any other RECEIVE or statement can (False)."""
        if group not in self._locked:
            self._reserved.pop(group, None)
            self.lock(holder, group, now_ms)
            return True
        self._reserved[group] = holder
        return False

    def unreserve(self, holder: H, group: str) -> None:
        if self._reserved.get(group) is holder:
            del self._reserved[group]

    def take_head(self, holder: H, group: str, now_ms: int) -> Buffered:
        """Lock `group` (one unlocked_heads() names) for `holder` and take its head record alone,
        expired or not; the rest of the group stays buffered, locked with it."""
        self._locked[group] = holder
        self._locked_since.setdefault(group, now_ms)
        self._owned.setdefault(id(holder.owner), {})[group] = None
        q = self._groups[group]
        b = q.popleft()
        self._buffered -= 1
        if not q:
            del self._groups[group]
        return b

    def release(self, holder: H, group: str, back: Sequence[Buffered] = ()) -> None:
        """End `holder`'s lock on `group` (if it is the one holding it) and put `back` (records
        it took, in the order taken) at the head of the group: a rollback."""
        if self._locked.get(group) is holder:
            del self._locked[group]
            since = self._locked_since.pop(group, None)
            owned = self._owned.get(id(holder.owner))
            if owned is not None:
                owned.pop(group, None)
                if not owned:
                    del self._owned[id(holder.owner)]
            reserved = self._reserved.pop(group, None)
            if reserved is not None:
                self.lock(reserved, group, since or 0)
        self.put_back(group, back)
        ready = self._groups.get(group)
        if ready and group not in self._locked:
            self._mark(group, ready)  # unlocked: ready again

    def put_back(self, group: str, back: Sequence[Buffered]) -> None:
        """Put `back` (records taken from `group`, in the order taken) at the head of the group,
        its lock left as it is: a rollback to a savepoint keeps the group locked, and the next
        RECEIVE of the group (its holder's, until it ends) takes them again, in order."""
        if back:
            q = self._groups.pop(group, deque())
            q.extendleft(reversed(back))
            self._groups[group] = q
            self._groups.move_to_end(group, last=False)
            self._buffered += len(back)

    def drop_partitions(self, partitions: Collection[int]) -> None:
        """Forget the buffered records of revoked partitions: their next owner reads them."""
        for group in list(self._groups):
            q = self._groups[group]
            kept = deque(b for b in q if b.partition not in partitions)
            self._buffered -= len(q) - len(kept)
            if kept:
                self._groups[group] = kept
                if kept[0] is not q[0]:
                    self._mark(group, kept)
            else:
                del self._groups[group]
