"""A Service Broker transaction: RECEIVE, SEND, BEGIN DIALOG and END CONVERSATION that commit or
roll back together.

    with broker.transaction() as tx:
        for msg in tx.receive("ExpenseQueue", top=10, wait=5):
            tx.send(msg.conversation_handle, reply_type, body)

SENDs and endpoint changes are held until commit; the commit goes through the process's group
committer, so it is one Kafka transaction with the consumed offsets. commit() returns when that
transaction committed. rollback() drops what was held and gives the received messages back, in
order, to the next RECEIVE. Leaving the block by an exception rolls back. savepoint(name) and
rollback_to(name) undo part of it (sdk/partial.py), keeping every lock it holds.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Self, overload

from kbroker import metrics, tracing
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import Message
from kbroker.core.dialogs.validation import to_bytes
from kbroker.core.txn.savepoints import Savepoints
from kbroker.core.txn.state import TransactionState
from kbroker.errors import (
    InvalidArgumentError,
    QueueDisabledError,
    TransactionAbortedError,
    TransactionInDoubtError,
    TransactionStateError,
)
from kbroker.kafka.receive.receiver import Lease
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.sdk import group_batches, partial
from kbroker.sdk.group_locks import GroupLocks
from kbroker.sdk.held import Held
from kbroker.sdk.rekeying import rekey
from kbroker.sdk.runtime import BrokerRuntime
from kbroker.sdk.send_trace import receive_trace, traced_record

log = logging.getLogger("kbroker.transaction")

ALL = sys.maxsize  # RECEIVE without TOP: the whole group


class Transaction:
    """BEGIN TRANSACTION ... COMMIT | ROLLBACK: statements whose records and endpoint changes are
    held until commit() sends them as one Kafka transaction with the received offsets. Get one
    from Broker.transaction()."""

    def __init__(self, runtime: BrokerRuntime):
        self._runtime = runtime
        self._held = Held(runtime)  # its records and endpoint changes, until it ends
        self._leases: list[Lease] = []
        self._queues: set[str] = set()
        self._locked_conversations: set[str] = set()  # SEND's conversation locks held
        self._groups = GroupLocks(runtime, self)  # the statements' conversation group locks
        self._generation: int | None = None  # the committer's, when this transaction first took a lease
        # Messages SENT and RECEIVEd per queue: the metrics count them once committed.
        self._sent: dict[str, int] = {}
        self._received: dict[str, int] = {}
        self._trace: Any = None  # the last RECEIVE's trace context: this transaction's SENDs continue it
        self._savepoints: Savepoints[partial.Mark] = Savepoints()
        self.state = TransactionState.OPEN  # moved only by _move
        self.committed_at: float | None = None
        runtime.active_transactions.opened()
        self._counted = True  # still among the process's active transactions (see committer)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._runtime.active_transactions.closed()

    def _check_open(self) -> None:
        if self.state is not TransactionState.OPEN:
            raise TransactionStateError(f"the transaction is already {self.state.value}")

    def _move(self, target: TransactionState) -> None:
        """Where the transaction is now; TransactionStateError when it cannot go there."""
        self.state = self.state.to(target)

    def endpoint(self, handle: str) -> Endpoint:
        """The endpoint of `handle` as this transaction sees it (its own changes included);
        ConversationNotFoundError if there is none."""
        return self._held.endpoint(str(handle))

    def _lock(self, handle: str) -> None:
        """SEND, END CONVERSATION, BEGIN CONVERSATION TIMER and MOVE lock the conversation until
        this transaction ends (see locks.py), before reading its endpoint."""
        handle = str(handle)
        self._lock_group(handle)  # its group first, so a group's holder is never waited for here
        if handle not in self._locked_conversations:
            rt = self._runtime
            rt.conversation_locks.lock(handle, self)
            self._locked_conversations.add(handle)
            self._lock_group(handle)  # moved meanwhile: the group it is in now
            if handle not in self._held.created:  # across processes too (send_lease.py)
                if self._generation is None:  # producers as old as the lease check: see committer
                    self._generation = rt.committer.generation
                rt.send_leases.hold(handle, rt.conversation_locks.timeout)

    def _lock_group(self, handle: str) -> None:
        """The conversation group lock of `handle`'s endpoint (group_locks.py), if it has one."""
        held = self._held.endpoints
        if (ep := held[handle] if handle in held else self._runtime.endpoints.find(handle)) is not None:
            self._groups.lock(ep)

    # --- statements --------------------------------------------------------------------------

    def receive(
        self,
        queue: str,
        top: int | None = None,
        wait: float | None = 0.0,
        *,
        conversation_group: str | None = None,
        conversation_handle: str | None = None,
        instance: str | None = None,
    ) -> list[Message]:
        """RECEIVE TOP(top) FROM queue, WAITFOR(wait seconds; None = no time-out). Returns the
        messages of one conversation group, in order, and keeps that group locked until the
        transaction ends. top=None: every ready message of that group, as RECEIVE without TOP
        (what this process holds of it: at most the receiver's buffer). `instance` receives from
        that instance's secondary queue instead."""
        return self._receive(queue, top, wait, conversation_group, conversation_handle, instance)

    def receive_ready(self, queue: str, top: int | None, wait: float) -> list[Message]:
        """receive_groups' further RECEIVEs: what this process holds now or within `wait`. A first
        RECEIVE that finds nothing waits until its partitions were read to their end after the
        last record fetched (Kafka says so at the next empty fetch, up to 500 ms on); these need
        them read to their end once since the process was given them."""
        return self._receive(queue, top, wait, settled=False)

    def _receive(
        self,
        queue: str,
        top: int | None,
        wait: float | None,
        conversation_group: str | None = None,
        conversation_handle: str | None = None,
        instance: str | None = None,
        settled: bool = True,
    ) -> list[Message]:
        self._check_open()
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
            raise InvalidArgumentError(f"top must be a whole number of at least 1, or None for all, not {top!r}")
        rt = self._runtime
        catalog, _ = rt.open_queue(queue)  # the one catalog look-up: QueueDisabledError unless ON
        conversation_id = None
        if conversation_handle is not None:
            conversation_id = self.endpoint(conversation_handle).conversation_id
        receiver = rt.receiver(queue, instance)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            rt.receive_hooks.before_receive(queue)
            lease, msgs = receiver.receive(
                self,
                ALL if top is None else top,
                remaining,
                give_up=lambda: not rt.queue_open(queue),
                conversation_group=conversation_group,
                conversation_id=conversation_id,
                settled=settled,
            )
            rt.receive_hooks.after_receive(queue, len(msgs))
            if lease is None and not rt.queue_open(queue):
                raise QueueDisabledError(queue)  # disabled while it waited, here or elsewhere
            if lease is not None and lease not in self._leases:
                self._leases.append(lease)
            delivered, moving = self._held.sort(msgs, catalog)
            if moving and lease is not None:  # messages come with the lease of their group
                rekey(rt, receiver, lease, moving, self._leases, self._over)
            if delivered or not msgs:
                if delivered:
                    self._queues.add(queue)  # poison counting looks at transactions that received
                    self._received[queue] = self._received.get(queue, 0) + len(delivered)
                    self._trace = receive_trace(rt.namespace, queue, delivered, self._trace)
                return delivered
            # Everything taken went on its way (moved conversations) or was set aside (refused on
            # arrival, for a closed endpoint): receive again, within what is left of the wait.

    def receive_groups(
        self, queue: str, groups: int, top: int | None = None, wait: float | None = 0.0, *, within: float = 0.0
    ) -> list[list[Message]]:
        """RECEIVE repeated for up to `groups` groups, each locked until it ends (group_batches.py)."""
        return group_batches.receive_groups(self, queue, groups, top, wait, within)

    def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group (a GUID, existing or new, of the same queue)."""
        self._check_open()
        self._lock(handle)
        self._groups.lock(self.endpoint(handle), group)  # and the group it moves to
        ep, records = self._runtime.statements.move_records(self.endpoint(handle), group)
        self._held.records.extend(records)
        self._held.stage(ep)

    def get_conversation_group(self, queue: str, wait: float | None = 0.0) -> str | None:
        """GET CONVERSATION GROUP: lock the next ready group without receiving from it."""
        self._check_open()
        lease, _ = self._runtime.receiver(queue).receive(self, 0, wait)
        if lease is None:
            return None
        self._leases.append(lease)
        return lease.group

    def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG: the initiator endpoint is written when the transaction commits. Keywords
        as Broker.begin_dialog's (lifetime, related_conversation[_group], instance)."""
        self._check_open()
        rt = self._runtime
        ep = rt.statements.new_dialog(from_service, to_service, contract, endpoint_of=self.endpoint, **kw)
        rt.check_send(ep)  # SEND permission on the target service: refused before anything is staged
        if ep.instance is not None:
            rt.secondary_queue(rt.statements.queue_of(ep.service_name), ep.instance)  # replies land there
        related = kw.get("related_conversation") is not None or kw.get("related_conversation_group") is not None
        self._groups.lock(ep, new=not related)  # its group: RELATED_CONVERSATION(_GROUP)'s, or a new one
        self._held.records.extend(rt.statements.lifetime_records(ep))
        self._held.stage(ep)
        self._held.created.add(ep.conversation_handle)
        return ep.conversation_handle

    @overload
    def send(self, handle: str, message_type: str = ..., body: Any = ..., **kw: Any) -> str:
        """SEND ON CONVERSATION handle: its message id."""

    @overload
    def send(self, handle: partial.Handles, message_type: str = ..., body: Any = ..., **kw: Any) -> list[str]:
        """SEND ON CONVERSATION (h1, h2, ...): their message ids, in order."""

    def send(
        self, handle: str | partial.Handles, message_type: str = "DEFAULT", body: Any = None, **kw: Any
    ) -> str | list[str]:
        """SEND ON CONVERSATION, held until commit: returns the message id. Keywords as
        Broker.send's (correlation_id, reply_to, time_to_be_received, priority).

        A list of handles is SEND ON CONVERSATION (h1, h2, ...): a message on each, all or none
        (one refused: the error it met, naming the handle, and none of them is held); returns
        their message ids in order. The body is made bytes once and every record carries it."""
        if not isinstance(handle, (list, tuple)):
            return self._send(str(handle), message_type, body, kw)
        self._check_open()
        handles, data, before = partial.conversations(handle), to_bytes(body), self._mark()
        return partial.all_or_none(
            handles, lambda h: self._send(h, message_type, data, kw), lambda: self._restore(before)
        )

    def _send(self, handle: str, message_type: str, body: Any, kw: dict[str, Any]) -> str:
        self._check_open()
        if str(handle) not in self._locked_conversations:  # the record's own check follows either way
            self._runtime.check_send(self.endpoint(handle))  # before its lock and lease: nothing written if refused
        self._lock(handle)
        before = self.endpoint(handle)
        rt = self._runtime
        record, message_id, ep = rt.statements.message_record(before, message_type, body, **kw)
        queue = names.queue_label(rt.namespace, record[0], rt.catalog.current.queues)
        record = traced_record(record, rt.namespace, queue, ep.conversation_id, message_type, self._trace)
        rt.check_send(ep, [record])  # its trace headers included
        self._held.records.append(record)
        self._held.records.extend(rt.statements.retained_records(ep, record))  # RETENTION = ON: status 3
        self._sent[queue] = self._sent.get(queue, 0) + 1
        self._held.stage_send(before, ep)
        return message_id

    def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER: armed when the transaction commits; arming again replaces it."""
        self._check_open()
        self._lock(handle)
        records, ep = self._runtime.statements.timer_records(self.endpoint(handle), timeout)
        self._held.records.extend(records)
        self._held.stage(ep)

    def end_conversation(
        self, handle: str, *, error: int | None = None, description: str | None = None, cleanup: bool = False
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP], held until commit."""
        self._check_open()
        self._lock(handle)
        ep = self.endpoint(handle)
        records, ended = self._runtime.statements.end_records(ep, error=error, description=description, cleanup=cleanup)
        self._runtime.check_send(ep, records)
        self._held.records.extend(records)
        if ended is None:
            self._held.remove(ep.conversation_handle)
        else:
            self._held.stage(ended)

    # --- savepoints --------------------------------------------------------------------------

    def savepoint(self, name: str) -> None:
        """SAVE TRANSACTION name: a mark that rollback_to(name) returns to. A name may be saved
        again; the rollback goes to the latest."""
        self._check_open()
        self._savepoints.save(name, self._mark())

    def rollback_to(self, name: str) -> None:
        """ROLLBACK TRANSACTION name: undo what the transaction did since the latest savepoint
        `name` (its SENDs, BEGIN DIALOGs, END CONVERSATIONs, timers, MOVEs, what its RECEIVEs
        staged) and give the messages it RECEIVEd since back to their groups, in order, for its
        next RECEIVE. Every lock stays until the transaction ends; the savepoints after `name`
        are gone, `name` stays. SavepointNotFoundError (6401) for a name it does not have."""
        self._check_open()
        self._restore(self._savepoints.rollback_to(name))

    def _mark(self) -> partial.Mark:
        return partial.mark(self._held, self._leases, self._queues, self._sent, self._received)

    def _restore(self, saved: partial.Mark) -> None:
        partial.give_back(self._leases, saved)
        self._held.restore(saved.held)
        self._queues = set(saved.queues)
        self._sent, self._received = dict(saved.sent), dict(saved.received)

    # --- outcome -----------------------------------------------------------------------------

    def commit(self) -> None:
        """COMMIT: returns once the Kafka transaction holding this one committed;
        TransactionAbortedError if it did not (nothing of it is visible then);
        TransactionInDoubtError if whether it did cannot be learnt."""
        self._check_open()
        rt = self._runtime
        records, leases = self._held.commit_records(self._locked_conversations)
        self._uncount()
        started = time.monotonic()
        try:
            if records or self._leases:
                req = CommitRequest(records, [*self._leases, *self._groups.leases(self._leases)], self._generation)
                with tracing.traced("kbroker commit", self._trace, rt.namespace):
                    rt.committer.commit(req)
                self.committed_at = req.committed_at
                metrics.of(metrics.COMMIT_SECONDS, rt.namespace).observe(time.monotonic() - started)
        except (TransactionAbortedError, TransactionInDoubtError) as exc:
            self._over(exc)
            raise
        self._held.committed(leases)
        metrics.of(metrics.TRANSACTIONS, rt.namespace, "committed").inc()
        for queue, count in self._sent.items():
            metrics.of(metrics.MESSAGES_SENT, rt.namespace, queue).inc(count)
        for queue, count in self._received.items():
            metrics.of(metrics.MESSAGES_RECEIVED, rt.namespace, queue).inc(count)
        self._end(committed=True)
        self._move(TransactionState.COMMITTED)

    def rollback(self) -> None:
        """ROLLBACK: drop what was held and give the received messages back, in order."""
        if self.state is not TransactionState.OPEN:
            return
        taken = partial.taken(self._leases)
        self._end(committed=False)
        self._move(TransactionState.ROLLED_BACK)
        metrics.of(metrics.TRANSACTIONS, self._runtime.namespace, "rolled_back").inc()
        for q in self._queues:
            self._runtime.note_rollback(q, taken.get(q, {}))
            self._runtime.receive_hooks.after_rollback(q)

    def _over(self, exc: TransactionAbortedError | TransactionInDoubtError) -> None:
        """A Kafka transaction of this one aborted or ended in doubt: this one is over. Its locks
        and leases go, or the next statement on its conversations would wait on them for ever."""
        aborted = isinstance(exc, TransactionAbortedError)
        metrics.of(metrics.TRANSACTIONS, self._runtime.namespace, "aborted" if aborted else "in_doubt").inc()
        if not aborted:
            self._held.in_doubt()
        self._end(committed=False)
        self._move(TransactionState.ABORTED if aborted else TransactionState.IN_DOUBT)

    def _end(self, committed: bool) -> None:
        self._uncount()
        taken = partial.taken(self._leases) if committed else {}
        if self._locked_conversations:  # after commit() noted the endpoints: the next holder reads them
            self._runtime.conversation_locks.release(self._locked_conversations, self)
            self._locked_conversations = set()
        self._groups.release(self._leases)
        for lease in self._leases:
            lease.receiver.release(lease, committed)
        if committed:
            for q in self._queues:
                self._runtime.note_commit(q, taken.get(q, {}))
        self._leases, self._held = [], Held(self._runtime)
        self._savepoints.discard_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.state is not TransactionState.OPEN:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
