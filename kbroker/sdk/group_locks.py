"""The conversation group locks one transaction holds for its statements (core/dialogs/group_lock.py
says which): each is taken in the process's receiver of the group's queue, the very lock RECEIVE
and GET CONVERSATION GROUP take, and ends with the transaction.

Where this process runs no receiver of the queue, nothing here RECEIVEs from it, and the lock is
the group's name among the process's conversation locks (core/dialogs/locks.py): it keeps two
transactions of the process that only send from holding the group at once. Across processes the
group lock is the partition's: only the process that owns the group's partition receives from
it, so a statement in another process is not excluded from a RECEIVE there (docs/sdk.md, Locks).
"""

from __future__ import annotations

from typing import Any

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.group_lock import ConversationGroupLockTimeoutError, GroupKey, group_key
from kbroker.errors import ConversationLockTimeoutError
from kbroker.kafka.receive.receiver import Lease
from kbroker.sdk.runtime import BrokerRuntime


class GroupLocks:
    """The group locks `owner` (a transaction, or a token for a statement outside one) holds."""

    def __init__(self, runtime: BrokerRuntime, owner: Any):
        self._runtime, self._owner = runtime, owner
        self._leases: dict[GroupKey, Lease] = {}  # taken in a receiver of this process
        self._named: set[GroupKey] = set()  # taken among the conversation locks (no receiver here)

    def lock(self, ep: Endpoint, group: str | None = None) -> None:
        """Lock the group of `ep` (or `group`, of its queue) until release(), waiting up to the
        lock time-out: ConversationGroupLockTimeoutError when another transaction holds it."""
        rt = self._runtime
        key = group_key(ep, rt.statements.queue_of(ep.service_name), group)
        if key in self._leases or key in self._named:
            return
        timeout = rt.conversation_locks.timeout
        receiver = rt.receivers().get(key.receiver)
        if receiver is not None and not receiver.closed:
            lease = receiver.lock_group(self._owner, key.group, timeout)
            if lease is None:
                raise ConversationGroupLockTimeoutError(key.group, timeout, ep.conversation_handle)
            self._leases[key] = lease
            return
        try:
            rt.conversation_locks.lock(key.fallback, self._owner)
        except ConversationLockTimeoutError:
            raise ConversationGroupLockTimeoutError(key.group, timeout, ep.conversation_handle) from None
        self._named.add(key)

    def release(self, received: list[Lease]) -> None:
        """The transaction ended: its group locks go, but for those a RECEIVE of it went on to
        take records with (`received`: its leases, which its end releases)."""
        for lease in self._leases.values():
            if lease not in received:
                lease.receiver.release(lease, committed=False)  # it took nothing: nothing goes back
        if self._named:
            self._runtime.conversation_locks.release([k.fallback for k in self._named], self._owner)
        self._leases, self._named = {}, set()
