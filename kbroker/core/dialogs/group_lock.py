"""The conversation group lock the statements that touch a conversation take, as Service Broker
takes it: BEGIN DIALOG (its new endpoint's group, RELATED_CONVERSATION(_GROUP)'s when named),
SEND, END CONVERSATION, BEGIN CONVERSATION TIMER and MOVE CONVERSATION (the group left and the
group moved to) lock the conversation group of this side's endpoint until the transaction ends,
as RECEIVE and GET CONVERSATION GROUP do.

The lock is the receive side's own: the group's entry in the queue receiver's group buffer
(core/receive/group_buffer.py), held by a lease that takes no record. A process that does not
read the group's partition holds it through the partition's reader (core/dialogs/group_hold.py),
which keeps its receiver's entry for the holder. A statement waits for a
group another transaction holds, up to the lock time-out, then fails with
ConversationGroupLockTimeoutError: two transactions locking two groups in opposite order (a
deadlock, SQL Server's error 1205) end, one statement or both failing, rather than hang.

Which lock a statement takes is decided here: the endpoint's queue receiver (its queue, or its
secondary queue for an instance) and group.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.errors import ConversationLockTimeoutError

DEADLOCK = 1205  # SQL Server's "chosen as the deadlock victim": what a time-out here stands for


@dataclass(frozen=True)
class GroupKey:
    """One conversation group lock: the receiver (queue, instance) and the group."""

    queue: str
    instance: str | None
    group: str

    @property
    def receiver(self) -> tuple[str, str | None]:
        """The key of the process's receiver of the group's queue (sdk/process.receiver_for)."""
        return (self.queue, self.instance)

    @property
    def fallback(self) -> str:
        """Its name among the conversation locks, where no receiver of the queue runs here."""
        return f"group:{self.queue}/{self.instance or ''}/{self.group}"


def group_key(ep: Endpoint, queue: str, group: str | None = None) -> GroupKey:
    """The group lock a statement on `ep` (whose service's queue is `queue`) takes: its own
    group, or `group` (MOVE CONVERSATION's destination)."""
    return GroupKey(queue, ep.instance, group or ep.conversation_group_id)


class ConversationGroupLockTimeoutError(ConversationLockTimeoutError):
    """Another transaction holds the conversation group (by RECEIVE, GET CONVERSATION GROUP or a
    statement on one of its conversations) and has not ended within the lock time-out; in a
    deadlock, the victim's error (SQL Server's 1205). A ConversationLockTimeoutError: a retry of
    the transaction may succeed."""

    number = DEADLOCK

    def __init__(self, group: str, timeout: float, handle: str | None = None):
        super().__init__(handle or group, timeout)  # `handle`: the conversation the statement touched
        self.group = group
        self.args = (
            f"conversation group {group} is locked by another open transaction (waited {timeout:g} s;"
            " a deadlock victim's error, 1205, when two transactions wait for each other)",
        )
