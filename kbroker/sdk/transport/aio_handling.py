"""Handling a message in asyncio: TransportEndpoint.handle_one (sdk/transport/handling.py) with
an awaited handler, in the endpoint's transaction mode, and its on_error (AsyncTransportEndpoint
has these through AsyncHandling; its readers and receive tasks call _handle_one)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from kbroker import tracing
from kbroker.core.records import Record
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.outbox_rows import source_of, to_dispatch
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.core.txn.state import TransactionState
from kbroker.sdk.transport.aio_transaction import AsyncTransportTransaction
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.on_error import error_context, settle
from kbroker.sdk.transport.transaction import TransportTransaction

log = logging.getLogger("kbroker.transport")
T = TypeVar("T")
AsyncHandler = Callable[[TransportMessage, AsyncTransportTransaction], Awaitable[None]]


class AsyncHandling:
    """The handling of one message at a time (mixed into AsyncTransportEndpoint)."""

    sync: TransportEndpoint
    _unclaimed: dict[str, int]

    async def _run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        raise NotImplementedError  # AsyncTransportEndpoint's

    async def _handle_one(self, queue: str, handler: AsyncHandler, wait: float | None, task: bool = False) -> bool:
        """TransportEndpoint.handle_one with an awaited handler. A 3.0 task (`task`) takes the
        message it was started for, from the buffer, still off the loop: a poison one is
        dead-lettered on the way, a Kafka transaction."""
        tx = self.sync.transaction()
        atx = AsyncTransportTransaction(tx, self._run)
        handling = False
        try:
            try:
                msg = await self._run(tx.receive, 0.0 if task else wait, queue=queue, buffered_only=task)
            finally:
                if task:
                    self._unclaimed[queue] -= 1
            if msg is None:
                await atx.commit()
                self.sync.receiving_worked()
                return False
            callback = self.sync.take_callback(msg)
            if callback is None:
                original = msg if self.sync.runtime.on_error is None else replace(msg, headers=dict(msg.headers))
                handling = True
                await self._run_handler(tx, atx, queue, msg, handler)
                handling = False
            if tx.state is TransactionState.OPEN:  # (None mode: committed before the handler ran)
                await atx.commit()
            self.sync.receiving_worked()
            if callback is not None:
                callback.set_result(msg)
        except Exception as exc:  # noqa: BLE001 - whatever the application's handler raises: rolled back
            if handling and self.sync.runtime.on_error is not None and tx.state is TransactionState.OPEN:
                await self._on_error(tx, atx, queue, original, exc)
            else:
                self.sync.handling_failed(tx, queue, exc, receiving=not handling)
            if not handling:
                await asyncio.sleep(self.sync.receive_backoff())
        return True

    async def _run_handler(
        self,
        tx: TransportTransaction,
        atx: AsyncTransportTransaction,
        queue: str,
        msg: TransportMessage,
        handler: AsyncHandler,
    ) -> None:
        """The handler, in the endpoint's transaction mode (or with its AsyncOutbox), and the
        audit copy (as Handling.run_handler)."""
        rt = self.sync.runtime
        started = datetime.now(timezone.utc)
        if rt.outbox is not None:
            await self._outboxed(tx, atx, queue, msg, handler, started)
            return
        if rt.transaction_mode is TransactionMode.NONE:
            original = msg if rt.on_error is None else replace(msg, headers=dict(msg.headers))
            await atx.commit()  # removed before it is handled: at most once
            tx = self.sync.transaction()  # the sends, dispatched when the handler returns
            atx = AsyncTransportTransaction(tx, self._run)
            try:
                with tracing.handling(queue, tx.trace_context, rt.namespace):
                    await handler(msg, atx)
                await self._run(tx.audit, msg, started)
                await atx.commit()
            except Exception as exc:  # noqa: BLE001 - None mode: the message is gone, the failure logged
                rt.count("lost")
                log.warning("handler on %s failed in transaction mode None: message %s lost: %s", queue, msg.id, exc)
                if rt.on_error is not None and tx.state is TransactionState.OPEN:
                    await self._on_error(tx, atx, queue, original, exc)  # its sends go out with HANDLED
                else:
                    tx.rollback(str(exc))
            return
        with tracing.handling(queue, tx.trace_context, rt.namespace):
            await handler(msg, atx)
        await self._run(tx.audit, msg, started)  # off the loop: the audit queue's first look-up
        if rt.transaction_mode is TransactionMode.RECEIVE_ONLY:
            await self._run(self.sync.dispatch_now, tx)

    async def _outboxed(
        self,
        tx: TransportTransaction,
        atx: AsyncTransportTransaction,
        queue: str,
        msg: TransportMessage,
        handler: AsyncHandler,
        started: datetime,
    ) -> None:
        """Handling._outboxed awaited: the handler in a transaction of the application's
        database (`tx.db`, an AsyncConnection), its sends stored in the outbox there, then
        dispatched with the message's removal (sdk/transport/aio_outbox.py)."""
        rt = self.sync.runtime
        outbox, name = rt.outbox, rt.settings.name
        source = source_of(msg.queue, msg.partition, msg.row_version)
        fresh: list[Record] = []
        async with outbox.begin() as conn:
            stored = await outbox.get(conn, name, msg.id)
            if stored is None:
                tx.db = conn
                try:
                    with tracing.handling(queue, tx.trace_context, rt.namespace):
                        await handler(msg, atx)
                    await self._run(tx.audit, msg, started)
                finally:
                    tx.db = None
                fresh = tx.take_records()
                await outbox.store(conn, name, msg.id, fresh, source)
        if stored is None:
            outbox.on_stored(msg.id)
        records, mark = to_dispatch(stored, fresh, source, rt.count)
        tx.put_records(records)
        await atx.commit()
        if mark:
            await outbox.dispatched(name, msg.id)

    async def _on_error(
        self,
        tx: TransportTransaction,
        atx: AsyncTransportTransaction,
        queue: str,
        original: TransportMessage,
        exc: Exception,
    ) -> None:
        """The application's `on_error` (a function or a coroutine function), sending through
        `atx`, and what it decided (sdk/transport/on_error.py)."""
        rt = self.sync.runtime
        ctx = await self._run(error_context, rt, tx, queue, original, exc, atx)
        result: object = None
        raised: BaseException | None = None
        try:
            result = rt.on_error(ctx)
            if inspect.isawaitable(result):
                result = await result
        except Exception as hook_exc:  # noqa: BLE001 - the application's callback: rolled back, critical error
            raised = hook_exc
        try:
            await self._run(settle, rt, tx, ctx, result, raised, self.sync.on_critical_error)
        except Exception as commit_exc:  # noqa: BLE001 - the commit failed: the message comes back by itself
            self.sync.handling_failed(tx, queue, commit_exc, receiving=True)
