"""A RECEIVE that meets records of a moved conversation (MOVE CONVERSATION): they are re-keyed
one hop to the group the conversation is in now, in a Kafka transaction of their own."""

from __future__ import annotations

from typing import Callable

from kbroker.core.dialogs.envelope import Message
from kbroker.errors import TransactionAbortedError
from kbroker.kafka.receive.receiver import Lease, QueueReceiver
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.sdk.runtime import BrokerRuntime


def rekey(
    rt: BrokerRuntime,
    receiver: QueueReceiver,
    lease: Lease,
    moving: list[tuple[Message, str | None]],
    leases: list[Lease],
    over: Callable[[TransactionAbortedError], None],
) -> None:
    """Re-key a moved conversation's records one hop (and consume move markers and retained
    copies) in a Kafka transaction of their own, committed before anything else is delivered:
    the records are never the RECEIVE's transaction's to deliver, and a rollback of it must not
    undo their journey. The group lock stays with that transaction's lease (in `leases`) until it
    ends, or is dropped now if the lease holds nothing else. When the Kafka transaction aborts,
    `over` ends that transaction aborted (TransactionAbortedError), every message it took back in
    its group."""
    records = [rt.statements.rekey_record(receiver.topic, m, group) for m, group in moving if group is not None]
    side = receiver.split(lease, [(m.partition, m.offset) for m, _ in moving])
    try:
        rt.committer.commit(CommitRequest(records, [side]))
    except TransactionAbortedError as exc:
        receiver.release(side, committed=False)  # back to the head of the group, in order
        over(exc)  # as an aborted COMMIT: its caller drops it, and a kept lease would lock the group
        raise
    if not lease.taken and not lease.offsets:
        receiver.release(lease, committed=True)  # nothing of this group was delivered
        leases.remove(lease)
    receiver.release(side, committed=True)
