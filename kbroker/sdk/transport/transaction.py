"""A transport transaction: receive one message (the table's `DELETE TOP(1)`), send while
handling it, and commit both, or roll both back.

    with endpoint.transaction() as tx:
        msg = tx.receive(wait=5)
        if msg is not None:
            tx.reply(msg, b"done")

The sends are held until commit and written in one Kafka transaction with the received
message's offset (the process's group committer), so a committed handler's sends and the removal
of its message happen exactly once together; a rollback drops the sends and puts the message
back for the next receive, here or in any instance. A message that failed before is handed out
again, retried later or moved to the error queue as the endpoint's recoverability says
(core/transport/recoverability.py; without one, after `max_deliveries` failures in this process
it goes to the dead-letter topic); an expired one (Expires passed) is removed and counted, never
handed out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Self

from kbroker import tracing
from kbroker.core.records import Record
from kbroker.core.transport.audit import audit_headers
from kbroker.core.transport.message import TransportEnvelope, TransportMessage, with_position
from kbroker.core.transport.recoverability import Failure
from kbroker.core.txn.state import TransactionState
from kbroker.errors import InvalidArgumentError, TransactionAbortedError, TransactionInDoubtError, TransactionStateError
from kbroker.kafka.receive.receiver import Lease
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.sdk.transport.publishing import publish_records
from kbroker.sdk.transport.runtime import TransportRuntime


class TransportTransaction:
    """One unit of work of a transport endpoint. Get one from TransportEndpoint.transaction()."""

    def __init__(self, runtime: TransportRuntime):
        self._rt = runtime
        self.trace_context: Any = None  # the last receive's (tracing.py): what this transaction sends continues it
        self._records: list[Record] = []
        self._leases: list[Lease] = []
        self.received: list[TransportMessage] = []
        self.state = TransactionState.OPEN  # moved only by _move
        self.db: Any = None  # with an outbox: the application's database connection, in its transaction
        runtime.active_transactions.opened()
        self._counted = True

    def _check_open(self) -> None:
        if self.state is not TransactionState.OPEN:
            raise TransactionStateError(f"the transaction is already {self.state.value}")

    def _move(self, target: TransactionState) -> None:
        """Where the transaction is now; TransactionStateError when it cannot go there."""
        self.state = self.state.to(target)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._rt.active_transactions.closed()

    # --- statements ---------------------------------------------------------------------------

    def receive(
        self, wait: float | None = 0.0, *, queue: str | None = None, buffered_only: bool = False
    ) -> TransportMessage | None:
        """The oldest message of `queue` (default: the endpoint's primary queue) that no other
        transaction holds, waiting up to `wait` s (None: without time-out); None if none came.
        wait=0 waits once for the queue's first fetch, as RECEIVE does; buffered_only returns at
        once with what this process holds (a 3.0 receive task, started for a counted message)."""
        self._check_open()
        rt = self._rt
        q = queue or rt.settings.primary_queue
        receiver = rt.receiver(q)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            lease, live, expired = receiver.take(
                self, 1, remaining, give_up=(lambda: True) if buffered_only else rt.closing
            )
            if lease is None:
                return None
            if expired:  # removed with this transaction, never handed out
                rt.count("expired", expired)
            if not live:
                if lease not in self._leases:
                    self._leases.append(lease)
                continue
            b = live[0]
            envelope = b.envelope
            assert isinstance(envelope, TransportEnvelope)  # a transport queue's receiver decodes these
            msg = with_position(envelope.message, q, b.partition, b.offset, b.enqueued_ms)
            if rt.recovered(lease, b, msg):  # it failed before: retried later or in the error queue
                continue
            if lease not in self._leases:
                self._leases.append(lease)
            if tracing.enabled():
                self.trace_context = tracing.receive_span(
                    rt.namespace, q, [tracing.context_of(list(msg.headers.items()))], None
                )
            self.received.append(msg)
            rt.count("received")
            return msg

    def send(
        self,
        destination: str,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        *,
        correlation_id: str | None = None,
        reply_to_address: str | None = None,
        recoverable: bool = True,
        time_to_be_received: float | None = None,
        message_id: str | None = None,
        delay: float | None = None,
        not_before: datetime | float | str | None = None,
        delayed_store: str | None = None,
    ) -> str:
        """INSERT a message into `destination`'s queue when this transaction commits; returns its
        Id. ReplyToAddress defaults to this instance's reply address. With `delay` or
        `not_before` the message is stored in the delayed store in this transaction and moved
        to `destination` when due (TransportEndpoint.send)."""
        self._check_open()
        headers = tracing.with_trace_headers(headers, self._rt.namespace, destination, self.trace_context)
        record, mid = self._rt.record(
            destination,
            body,
            headers,
            correlation_id=correlation_id,
            reply_to_address=reply_to_address,
            recoverable=recoverable,
            time_to_be_received=time_to_be_received,
            message_id=message_id,
            delay=delay,
            not_before=not_before,
            delayed_store=delayed_store,
        )
        self._records.append(record)
        return mid

    def publish(
        self,
        event_type: str | Sequence[str] | None,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        *,
        correlation_id: str | None = None,
        recoverable: bool = True,
        time_to_be_received: float | None = None,
        message_id: str | None = None,
    ) -> str:
        """Publish an event when this transaction commits: one copy (one Id) to each endpoint
        subscribed to `event_type` or, for a list, to any of its types (the event's type, then
        its base types and interfaces); None: the types its EnclosedMessageTypes header names.
        Subscriptions are those this instance's copy of the table holds (at most its staleness,
        5 s, old). Returns the Id."""
        self._check_open()
        headers = tracing.with_trace_headers(headers, self._rt.namespace, "publish", self.trace_context)
        records, mid, _queues = publish_records(
            self._rt,
            event_type,
            body,
            headers,
            message_id=message_id,
            correlation_id=correlation_id,
            reply_to_address=None,
            recoverable=recoverable,
            time_to_be_received=time_to_be_received,
        )
        self._records.extend(records)
        return mid

    def take_records(self) -> list[Record]:
        """The sends held so far, taken out (the outbox stores them; ReceiveOnly dispatches them)."""
        records, self._records = self._records, []
        return records

    def put_records(self, records: list[Record]) -> None:
        """Sends to commit with this transaction (an outbox row's, dispatched with the removal)."""
        self._check_open()
        self._records.extend(records)

    def audit(self, msg: TransportMessage, started: datetime) -> None:
        """Copy the processed `msg` to the endpoint's audit queue with this transaction (nothing
        when the endpoint audits nothing): its headers and when and where it was processed."""
        queue = self._rt.audit_queue
        if queue is None:
            return
        s = self._rt.settings
        hs = audit_headers(
            msg.headers, endpoint=s.name, machine=s.machine, started=started, ended=datetime.now(timezone.utc)
        )
        record, _ = self._rt.copy(msg, queue, hs)
        self._records.append(record)

    def reply(
        self, message: TransportMessage, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> str:
        """Send to the message's ReplyToAddress, with its Id as the CorrelationId (what a
        callback waiting on the request matches)."""
        if not message.reply_to_address:
            raise InvalidArgumentError(f"message {message.id} has no ReplyToAddress to reply to")
        return self.send(message.reply_to_address, body, headers, correlation_id=message.id, **kw)

    # --- outcome -------------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit: returns once the Kafka transaction holding this one committed.
        TransactionAbortedError if it did not (the messages come back, nothing sent is visible)."""
        self._check_open()
        self._uncount()
        try:
            if self._records or self._leases:
                with tracing.traced("kbroker commit", self.trace_context, self._rt.namespace):
                    self._rt.committer.commit(CommitRequest(self._records, self._leases))
        except (TransactionAbortedError, TransactionInDoubtError) as exc:
            self._end(committed=False)
            self._move(
                TransactionState.ABORTED if isinstance(exc, TransactionAbortedError) else TransactionState.IN_DOUBT
            )
            raise
        self._end(committed=True)
        self._move(TransactionState.COMMITTED)

    def rollback(self, reason: str = "rolled back", exc: BaseException | None = None) -> None:
        """Drop the sends and give the received message back; counts a failed delivery of it
        (`exc`: what the handler raised, for the error queue's headers if it comes to that)."""
        if self.state is not TransactionState.OPEN:
            return
        failure = None if exc is None else Failure.of(exc)
        for lease in self._leases:
            for b in lease.taken:
                self._rt.failures.failed((lease.receiver.topic, b.partition, b.offset), reason, failure)
        self._end(committed=False)
        self._move(TransactionState.ROLLED_BACK)

    def _end(self, committed: bool) -> None:
        self._uncount()
        for lease in self._leases:
            lease.receiver.release(lease, committed)
            if committed:
                for b in lease.taken:
                    self._rt.failures.forget((lease.receiver.topic, b.partition, b.offset))
        self._rt.count("committed" if committed else "rolled_back", len(self.received))
        self._leases, self._records = [], []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if self.state is not TransactionState.OPEN:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback(f"{exc_type.__name__}: {exc}", exc)


# What an endpoint's readers hand each message to, with the transaction it is received in.
Handler = Callable[[TransportMessage, TransportTransaction], None]
