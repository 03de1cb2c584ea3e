"""The conversation groups this process's transactions lock outside its receiver of their queue
(sdk/group_locks.py: by name and a hold on the holds topic), kept in that receiver too.

A transaction locks a group by name when the receiver of the group's queue here does not serve
the group's partition: there is no receiver yet, or it has not been given the partition. The
hold keeps other processes off the group, but not this process's own receiver once it starts to
serve the partition: its RECEIVE and GET CONVERSATION GROUP know only its lease book. So each
such lock is also a lease in the receiver: at once where one has served the queue here, and
otherwise reserved when one is first given the partition, before it serves it (`owned`, on its
poll thread). Both sides decide under one mutex, so no receiver starts serving between a
transaction's look and its entry.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from kbroker.core.dialogs.group_lock import GroupKey
from kbroker.kafka.receive.receiver import Lease, QueueReceiver


@dataclass(eq=False)
class NamedLock:
    """One transaction's lock of one group by name, and its leases in this process's receivers."""

    key: GroupKey
    partition: int
    owner: Any
    leases: list[tuple[QueueReceiver, Lease]] = field(default_factory=list)


class LocalHolds:
    """The groups transactions here lock by name, kept in this process's receivers."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[tuple[GroupKey, int], NamedLock] = {}  # (key, id(owner))
        self._readers: dict[tuple[str, str | None], QueueReceiver] = {}  # the last given partitions

    def enter(self, key: GroupKey, partition: int, owner: Any, timeout: float) -> NamedLock | None:
        """`owner` holds `key` by name (the group's `partition` of its queue's topic): keep it in
        the receiver that has served the queue here, waiting up to `timeout` s for a transaction
        holding it there; None when that one did not end in time (nothing is kept then)."""
        lock = NamedLock(key, partition, owner)
        with self._mutex:
            self._locks[(key, id(owner))] = lock
            reader = self._readers.get(key.receiver)
        if reader is None:
            return lock  # a receiver given the partition later reserves it first (owned)
        lease = reader.lock_group(owner, key.group, timeout)
        if lease is None:
            self.leave(lock, [])
            return None
        with self._mutex:
            lock.leases.append((reader, lease))
        return lock

    def owned(self, queue: str, instance: str | None, reader: QueueReceiver, partitions: list[int]) -> None:
        """`reader` was given `partitions` and serves them once this returns: the groups there
        that transactions here lock by name are reserved in it for them first."""
        given = set(partitions)
        with self._mutex:
            self._readers[(queue, instance)] = reader
            due = [
                lock
                for lock in self._locks.values()
                if lock.key.receiver == (queue, instance)
                and lock.partition in given
                and all(r is not reader for r, _ in lock.leases)
            ]
        for lock in due:
            lease, _locked = reader.reserve_group(lock.owner, lock.key.group)
            with self._mutex:
                if self._locks.get((lock.key, id(lock.owner))) is lock:  # not left meanwhile
                    lock.leases.append((reader, lease))
                    continue
            reader.unreserve(lease)  # it ended meanwhile
            reader.release(lease, committed=False)

    def leave(self, lock: NamedLock, received: list[Lease]) -> None:
        """The transaction's lock ended: its leases go, but for those a RECEIVE of it went on to
        take records with (`received`), which the transaction's end releases."""
        with self._mutex:
            self._locks.pop((lock.key, id(lock.owner)), None)
            leases, lock.leases = lock.leases, []
        for reader, lease in leases:
            reader.unreserve(lease)
        for reader, lease in leases:
            if lease not in received:
                reader.release(lease, committed=False)
