"""Handling a message: one transaction per message, its handler or callback, the audit copy, and
what a failure does (TransportEndpoint has these through Handling; the pumps call handle_one)."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from datetime import datetime, timezone

from kbroker import tracing
from kbroker.core.transport.message import TransportMessage
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import Handler, TransportTransaction

log = logging.getLogger("kbroker.transport")


class Handling:
    """The handling of one message at a time (mixed into TransportEndpoint)."""

    runtime: TransportRuntime

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
        try:
            try:
                msg = tx.receive(wait, queue=queue, buffered_only=give_up_fast)
            finally:
                on_received()
            if msg is None:
                tx.commit()  # expired messages it removed, if any
                return False
            callback = self.take_callback(msg)
            if callback is None:
                started = datetime.now(timezone.utc)
                with tracing.handling(queue, tx.trace_context, self.runtime.namespace):
                    handler(msg, tx)
                tx.audit(msg, started)
            tx.commit()
            if callback is not None:
                callback.set_result(msg)
        except Exception as exc:  # noqa: BLE001 - whatever the application's handler raises: rolled back
            self.handling_failed(tx, queue, exc)
        return True

    def handling_failed(self, tx: TransportTransaction, queue: str, exc: Exception) -> None:
        """A handler raised (its transaction rolls back and counts a failed delivery), or its
        commit failed (the transaction is over: the message comes back by itself)."""
        if tx.state == "open":
            tx.rollback(f"{type(exc).__name__}: {exc}", exc)
            self.runtime.count("failed")
            log.warning("handler on %s failed; its transaction rolled back: %s", queue, exc)
        else:
            log.warning("commit on %s failed: %s", queue, exc)
