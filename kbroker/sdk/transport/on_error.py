"""An endpoint's `on_error` callback: NServiceBus's onError, called when a handler raised, in
the failed message's transaction, before the recoverability policy is asked.

    def on_error(ctx: ErrorContext) -> ErrorResult | None:
        if ctx.immediate_failures >= 3:
            ctx.transaction.send("Sales.Failures", ctx.message.body, {"why": str(ctx.exception)})
            return ErrorResult.HANDLED  # removed, with that send, in one transaction
        return ErrorResult.RETRY  # handed out again at once

The failed handler's sends are dropped before the callback runs; `ctx.message` is the message
as it was received (what the handler changed in its headers is not seen). HANDLED commits the
removal and the callback's sends together; RETRY rolls back and hands the message out again,
whatever the policy says; None rolls back and leaves the message to the policy (immediate
retries, delayed retries, the error queue). A callback that raises rolls back too: the message
comes back, its handler runs again, and the endpoint's critical error is raised, as NServiceBus
does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import ErrorResult, rounds_of
from kbroker.core.txn.state import TransactionState
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import TransportTransaction

log = logging.getLogger("kbroker.transport")


@dataclass
class ErrorContext:
    """What `on_error` is told. `immediate_failures`: the failed deliveries of this message in
    this instance, this one included (NServiceBus's ImmediateProcessingFailures);
    `delayed_deliveries`: its delayed retries so far; `transaction`: the failed message's
    (TransportTransaction, or AsyncTransportTransaction on the asyncio endpoint): what is sent
    through it goes out with HANDLED only."""

    exception: BaseException
    message: TransportMessage
    immediate_failures: int
    delayed_deliveries: int
    queue: str
    transaction: Any
    position: tuple[str, int, int] = field(repr=False, default=("", -1, -1))


def error_context(
    rt: TransportRuntime,
    tx: TransportTransaction,
    queue: str,
    original: TransportMessage,
    exc: BaseException,
    handle: Any,
) -> ErrorContext:
    """The context of a failed handler, its sends dropped (`handle`: the transaction the
    callback sends through)."""
    tx.take_records()  # a failed handler's sends are never dispatched
    position = (rt.receiver(queue).topic, original.partition, original.row_version)
    return ErrorContext(
        exception=exc,
        message=original,
        immediate_failures=rt.failures.count(position) + 1,
        delayed_deliveries=rounds_of(original.headers),
        queue=queue,
        transaction=handle,
        position=position,
    )


def settle(
    rt: TransportRuntime,
    tx: TransportTransaction,
    ctx: ErrorContext,
    result: Any,
    raised: BaseException | None,
    critical: Any,
) -> None:
    """Do what `on_error` decided (`result`), or roll back when it `raised` (and call
    `critical`, the endpoint's critical-error callback)."""
    exc = ctx.exception
    reason = f"{type(exc).__name__}: {exc}"
    if raised is None and result is ErrorResult.HANDLED:
        if tx.state is TransactionState.OPEN:
            tx.commit()  # the removal and on_error's sends; a failure here brings the message back
        rt.failures.forget(ctx.position)
        rt.count("handled_on_error")
        return
    if raised is None and result is ErrorResult.RETRY:
        rt.failures.request_retry(ctx.position)  # before the rollback: another reader may take it at once
    elif raised is None and result is not None:
        log.warning("on_error returned %r, not an ErrorResult or None: the recoverability policy decides", result)
    tx.take_records()  # what on_error sent goes only with HANDLED
    if tx.state is TransactionState.OPEN:
        tx.rollback(reason, exc)
        rt.count("failed")
    if raised is not None:
        log.error("on_error raised for message %s of %s: %s; the message comes back", ctx.message.id, ctx.queue, raised)
        try:
            critical(raised)
        except Exception as cb_exc:  # noqa: BLE001 - the application's callback must not stop the readers
            log.error("the critical-error callback raised: %s", cb_exc)
