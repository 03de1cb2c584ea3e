"""The conversation group locks one transaction holds for its statements (core/dialogs/group_lock.py
says which), until it ends.

Where this process's receiver of the group's queue serves the group's partition, the lock is the
one RECEIVE and GET CONVERSATION GROUP take there. Anywhere else, the group's name among the
process's conversation locks (core/dialogs/locks.py) keeps this process's other transactions
off it, and a hold on the holds topic (kafka/dialogs/group_holds.py) keeps every other process
off it: the partition's reader grants it once no transaction there holds the group, and keeps
RECEIVE and GET CONVERSATION GROUP off the group until the hold ends; this process's own
receiver of the queue keeps it too (local_holds.py), should it serve the partition meanwhile. A
group BEGIN DIALOG makes takes no hold: no other process can know it before the transaction
commits. Nor does the first transaction after BEGIN DIALOG made one outside a transaction
(`FreshGroups`): until a message on it goes out, nothing can arrive in the group for another
process to RECEIVE, and no other process knows its handle unless the application gave it away
at once.
"""

from __future__ import annotations

from typing import Any

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.group_lock import ConversationGroupLockTimeoutError, GroupKey, group_key
from kbroker.errors import ConversationLockTimeoutError
from kbroker.kafka.dialogs.group_holds import IO_SECONDS
from kbroker.kafka.receive.receiver import Lease
from kbroker.sdk.local_holds import NamedLock
from kbroker.sdk.runtime import BrokerRuntime


class GroupLocks:
    """The group locks `owner` (a transaction, or a token for a statement outside one) holds."""

    def __init__(self, runtime: BrokerRuntime, owner: Any):
        self._runtime, self._owner = runtime, owner
        self._leases: dict[GroupKey, Lease] = {}  # taken in a receiver of this process
        self._named: set[GroupKey] = set()  # taken among the conversation locks (no receiver here)
        self._held: set[GroupKey] = set()  # of those, the ones held on the holds topic too
        self._kept: list[NamedLock] = []  # and kept in this process's receivers (local_holds.py)

    def lock(self, ep: Endpoint, group: str | None = None, *, new: bool = False) -> None:
        """Lock the group of `ep` (or `group`, of its queue) until release(), waiting up to the
        lock time-out: ConversationGroupLockTimeoutError when another transaction holds it.
        `new`: a group BEGIN DIALOG just made (no other process can hold it)."""
        rt = self._runtime
        key = group_key(ep, rt.statements.queue_of(ep.service_name), group)
        if key in self._leases or key in self._named:
            return
        timeout = rt.conversation_locks.timeout
        receiver = rt.receivers().get(key.receiver)
        topic = rt.queue_topic_of(key.queue, key.instance)
        holds = None if new or rt.fresh_groups.take(key.group) else rt.group_holds
        serves = receiver is not None and not receiver.closed
        # Kafka's bound, not the lock time-out's: that one counts waiting for other transactions.
        partition = None if holds is None else holds.partition_for(topic, key.group, max(timeout, IO_SECONDS))
        if serves and receiver is not None and partition is not None:
            serves = receiver.owns(partition)
        if serves and receiver is not None:
            lease = receiver.lock_group(self._owner, key.group, timeout, partition)
            if lease is None:
                raise ConversationGroupLockTimeoutError(key.group, timeout, ep.conversation_handle)
            self._leases[key] = lease
            return
        try:
            rt.conversation_locks.lock(key.fallback, self._owner)
        except ConversationLockTimeoutError:
            raise ConversationGroupLockTimeoutError(key.group, timeout, ep.conversation_handle) from None
        self._named.add(key)
        if holds is None or partition is None:
            return
        try:
            holds.hold((key.queue, key.instance, key.group), topic, timeout, ep.conversation_handle)
            self._held.add(key)
            kept = rt.local_holds.enter(key, partition, self._owner, timeout)  # this process's receivers
            if kept is None:
                raise ConversationGroupLockTimeoutError(key.group, timeout, ep.conversation_handle)
            self._kept.append(kept)
        except BaseException:
            if key in self._held:
                self._held.discard(key)
                holds.done((key.queue, key.instance, key.group))
            self._named.discard(key)
            rt.conversation_locks.release([key.fallback], self._owner)
            raise

    def leases(self, besides: list[Lease]) -> list[Lease]:
        """The receiver leases of these locks but `besides`: a commit carries them, so a
        revocation of their partition dooms it rather than let the next owner serve the group."""
        others = {id(lease) for lease in besides}  # a batch's RECEIVEs hold tens of groups
        return [lease for lease in self._leases.values() if id(lease) not in others]

    def release(self, received: list[Lease]) -> None:
        """The transaction ended: its group locks go, but for those a RECEIVE of it went on to
        take records with (`received`: its leases, which its end releases)."""
        for lease in self._leases.values():
            if lease not in received:
                lease.receiver.release(lease, committed=False)  # it took nothing: nothing goes back
        for kept in self._kept:
            self._runtime.local_holds.leave(kept, received)
        for key in self._held:
            self._runtime.group_holds.done((key.queue, key.instance, key.group))
        if self._named:
            self._runtime.conversation_locks.release([k.fallback for k in self._named], self._owner)
        self._leases, self._named, self._held, self._kept = {}, set(), set(), []
