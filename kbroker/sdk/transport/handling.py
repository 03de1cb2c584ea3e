"""Handling a message: one transaction per message, its handler or callback, the audit copy, and
what a failure does (TransportEndpoint has these through Handling; the pumps call handle_one)."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone

from kbroker import tracing
from kbroker.core.health import backoff
from kbroker.core.records import Record
from kbroker.core.transport.circuit_breaker import ReceiveCircuitBreaker
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.outbox_rows import source_of, to_dispatch
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.core.txn.state import TransactionState
from kbroker.sdk.transport.on_error import error_context, settle
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import Handler, TransportTransaction

log = logging.getLogger("kbroker.transport")


class Handling:
    """The handling of one message at a time (mixed into TransportEndpoint)."""

    runtime: TransportRuntime
    breaker: ReceiveCircuitBreaker
    on_critical_error: Callable[[BaseException], None]

    def transaction(self) -> TransportTransaction:
        raise NotImplementedError  # TransportEndpoint's

    def take_callback(self, msg: TransportMessage) -> concurrent.futures.Future[TransportMessage] | None:
        raise NotImplementedError  # TransportEndpoint's

    def handle_one(
        self,
        queue: str,
        handler: Handler,
        wait: float | None,
        give_up_fast: bool = False,
        on_received: Callable[[], None] = lambda: None,
    ) -> bool:
        """One transaction: receive from `queue`, hand the message to its callback or `handler`,
        commit (a failure rolls back). Returns whether a message was there. `on_received` is
        called once the receive returned (or failed), message or not."""
        tx = self.transaction()
        handling = False
        try:
            try:
                msg = tx.receive(wait, queue=queue, buffered_only=give_up_fast)
            finally:
                on_received()
            if msg is None:
                tx.commit()  # expired messages it removed, if any
                self.receiving_worked()
                return False
            callback = self.take_callback(msg)
            if callback is None:
                handling = True
                original = msg if self.runtime.on_error is None else replace(msg, headers=dict(msg.headers))
                self.run_handler(tx, queue, msg, handler)
                handling = False
            if tx.state is TransactionState.OPEN:  # (None mode: committed before the handler ran)
                tx.commit()
            self.receiving_worked()
            if callback is not None:
                callback.set_result(msg)
        except Exception as exc:  # noqa: BLE001 - whatever the application's handler raises: rolled back
            if handling and self.runtime.on_error is not None and tx.state is TransactionState.OPEN:
                self.call_on_error(tx, queue, original, exc)
            else:
                self.handling_failed(tx, queue, exc, receiving=not handling)
            if not handling:
                time.sleep(self.receive_backoff())
        return True

    def call_on_error(self, tx: TransportTransaction, queue: str, original: TransportMessage, exc: Exception) -> None:
        """The application's `on_error` for a handler that raised, and what it decided
        (sdk/transport/on_error.py); a commit that then fails brings the message back."""
        ctx = error_context(self.runtime, tx, queue, original, exc, tx)
        result: object = None
        raised: BaseException | None = None
        try:
            result = self.runtime.on_error(ctx)
        except Exception as hook_exc:  # noqa: BLE001 - the application's callback: rolled back, critical error
            raised = hook_exc
        try:
            settle(self.runtime, tx, ctx, result, raised, self.on_critical_error)
        except Exception as commit_exc:  # noqa: BLE001 - the commit failed: the message comes back by itself
            self.handling_failed(tx, queue, commit_exc, receiving=True)

    def receive_backoff(self) -> float:
        """Seconds to wait after a failed receive before the next: 0.1 s doubling to 5 s, so a
        queue that cannot be read is not asked in a loop."""
        return backoff(self.breaker.failures, 0.1, 5.0)

    def run_handler(self, tx: TransportTransaction, queue: str, msg: TransportMessage, handler: Handler) -> None:
        """The handler, in the endpoint's transaction mode (or with its outbox), and the audit copy."""
        rt = self.runtime
        started = datetime.now(timezone.utc)
        if rt.outbox is not None:
            self._outboxed(tx, queue, msg, handler, started)
            return
        if rt.transaction_mode is TransactionMode.NONE:
            original = msg if rt.on_error is None else replace(msg, headers=dict(msg.headers))
            tx.commit()  # removed before it is handled: at most once
            tx = self.transaction()  # the sends, dispatched when the handler returns
            try:
                with tracing.handling(queue, tx.trace_context, rt.namespace):
                    handler(msg, tx)
                tx.audit(msg, started)
                tx.commit()
            except Exception as exc:  # noqa: BLE001 - None mode: the message is gone, the failure logged
                rt.count("lost")
                log.warning("handler on %s failed in transaction mode None: message %s lost: %s", queue, msg.id, exc)
                if rt.on_error is not None and tx.state is TransactionState.OPEN:
                    self.call_on_error(tx, queue, original, exc)  # its sends go out with HANDLED; no retry is possible
                else:
                    tx.rollback(str(exc))
            return
        with tracing.handling(queue, tx.trace_context, rt.namespace):
            handler(msg, tx)
        tx.audit(msg, started)
        if rt.transaction_mode is TransactionMode.RECEIVE_ONLY:
            self.dispatch_now(tx)

    def dispatch_now(self, tx: TransportTransaction) -> None:
        """ReceiveOnly: the handler's sends on their own, acknowledged, before the removal commits."""
        records = tx.take_records()
        if records:
            with self.runtime.acknowledged() as produce:
                for record in records:
                    produce(record)

    def _outboxed(
        self, tx: TransportTransaction, queue: str, msg: TransportMessage, handler: Handler, started: datetime
    ) -> None:
        """The handler in a transaction of the application's database, its sends stored in the
        outbox there; then dispatched with the message's removal (sdk/transport/outbox.py)."""
        rt = self.runtime
        outbox, name = rt.outbox, rt.settings.name
        source = source_of(msg.queue, msg.partition, msg.row_version)
        fresh: list[Record] = []
        with outbox.begin() as conn:
            stored = outbox.get(conn, name, msg.id)
            if stored is None:
                tx.db = conn
                try:
                    with tracing.handling(queue, tx.trace_context, rt.namespace):
                        handler(msg, tx)
                    tx.audit(msg, started)
                finally:
                    tx.db = None
                fresh = tx.take_records()
                outbox.store(conn, name, msg.id, fresh, source)
        if stored is None:
            outbox.on_stored(msg.id)
        records, mark = to_dispatch(stored, fresh, source, rt.count)
        tx.put_records(records)
        tx.commit()
        if mark:
            outbox.dispatched(name, msg.id)

    def receiving_worked(self) -> None:
        """A receive and its commit worked: the circuit breaker is armed again."""
        if self.breaker.failures:
            self.breaker.succeeded()

    def receiving_failed(self, queue: str, exc: BaseException) -> None:
        """A receive or its commit failed: when that has gone on for the breaker's time, the
        endpoint's critical error (`on_critical_error`, once until receiving works again)."""
        if not self.breaker.failed(time.monotonic()):
            return
        log.error("receiving from %s has failed for %.0f s: critical error: %s", queue, self.breaker.time_to_wait, exc)
        try:
            self.on_critical_error(exc)
        except Exception as cb_exc:  # noqa: BLE001 - the application's callback must not stop the readers
            log.error("the critical-error callback raised: %s", cb_exc)

    def handling_failed(self, tx: TransportTransaction, queue: str, exc: Exception, receiving: bool = False) -> None:
        """A handler raised (its transaction rolls back and counts a failed delivery), or its
        receive or commit failed (`receiving`: the circuit breaker counts it; a commit that
        failed is over: the message comes back by itself)."""
        if receiving:
            self.receiving_failed(queue, exc)
        if tx.state == "open":
            tx.rollback(f"{type(exc).__name__}: {exc}", exc)
            self.runtime.count("failed")
            log.warning("handler on %s failed; its transaction rolled back: %s", queue, exc)
        else:
            log.warning("commit on %s failed: %s", queue, exc)
