"""The transport face in asyncio: the same endpoint, its handlers coroutines.

    ep = await kbroker.transport.async_endpoint("Sales", install=True)
    async def handle(msg, tx):
        await tx.reply(msg, b"ok")
    await ep.start(handle)          # 3.0: a monitoring loop and up to MaximumConcurrencyLevel tasks
    ...
    await ep.close()

The runtime underneath is the thread-based one (kafka/receive/receiver.py's poll thread, the group
committer). What may block (a receive that waits, a commit, a queue look-up) runs on the
endpoint's own thread pool, sized for its concurrency, never on the event loop; a receive task
of the 3.0 model takes its counted message there too, since a poison one is dead-lettered on the way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from typing import Any, Mapping, Protocol, Self, TypeVar

from kbroker import tracing
from kbroker.core.activation.ramp import RampUp
from kbroker.core.transport.endpoint import FIXED, MONITOR, receive_tasks_to_start
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.subscriptions import Subscription
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.endpoint import endpoint as sync_endpoint
from kbroker.sdk.transport.transaction import TransportTransaction

log = logging.getLogger("kbroker.transport")
T = TypeVar("T")
AsyncHandler = Callable[[TransportMessage, "AsyncTransportTransaction"], Awaitable[None]]
WAIT = 1.0


async def endpoint(name: str, **kwargs: Any) -> AsyncTransportEndpoint:
    """An endpoint instance (see TransportEndpoint), connected off the event loop by the broker
    rule (see sdk.transport.endpoint)."""
    return AsyncTransportEndpoint(await asyncio.to_thread(sync_endpoint, name, **kwargs))


class Runner(Protocol):
    """How a transaction's statements are run off the event loop: fn(*args, **kw), awaited."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kw: Any) -> Awaitable[T]: ...


class AsyncTransportTransaction:
    """A TransportTransaction whose blocking statements are awaited; `sync` is underneath."""

    def __init__(self, tx: TransportTransaction, run: Runner):
        self.sync, self._run = tx, run

    @property
    def state(self) -> str:
        """open, committed, rolled back, aborted or in doubt."""
        return self.sync.state

    async def receive(self, wait: float | None = 0.0, *, queue: str | None = None) -> TransportMessage | None:
        """See TransportTransaction.receive."""
        return await self._run(self.sync.receive, wait, queue=queue)

    async def send(
        self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> str:
        """See TransportTransaction.send."""
        return await self._run(self.sync.send, destination, body, headers, **kw)

    async def reply(
        self, message: TransportMessage, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> str:
        """See TransportTransaction.reply."""
        return await self._run(self.sync.reply, message, body, headers, **kw)

    async def publish(
        self,
        event_type: str | Sequence[str] | None,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> str:
        """See TransportTransaction.publish."""
        return await self._run(self.sync.publish, event_type, body, headers, **kw)

    async def commit(self) -> None:
        """See TransportTransaction.commit."""
        await self._run(self.sync.commit)

    async def rollback(self, reason: str = "rolled back", exc: BaseException | None = None) -> None:
        """See TransportTransaction.rollback."""
        self.sync.rollback(reason, exc)  # releases in-process leases only: never blocks

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback(f"{exc_type.__name__}: {exc}", exc)


class AsyncTransportEndpoint:
    """An endpoint instance for asyncio code; `sync` is the TransportEndpoint underneath.
    After start(), `running` and `peak` give the primary queue's receive tasks now and at most."""

    def __init__(self, ep: TransportEndpoint):
        self.sync = ep
        s = ep.settings
        self._pool = concurrent.futures.ThreadPoolExecutor(
            s.max_concurrency + s.secondary_readers + 4, thread_name_prefix=f"kbroker-aio-{s.name}"
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._unclaimed: dict[str, int] = {}
        self._slot_freed: dict[str, asyncio.Event] = {}  # per queue: one of its readers or tasks ended

    @property
    def settings(self) -> Any:
        """The endpoint's TransportSettings."""
        return self.sync.settings

    async def _run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        # In the caller's context (as asyncio.to_thread does; run_in_executor alone does not): a
        # handler's span is current in the pool thread, so what it sends continues its trace.
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kw)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def transaction(self) -> AsyncTransportTransaction:
        """Begin a transaction whose statements are awaited."""
        return AsyncTransportTransaction(self.sync.transaction(), self._run)

    async def send(
        self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> str:
        """See TransportEndpoint.send."""
        return await self._run(self.sync.send, destination, body, headers, **kw)

    async def request(
        self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> TransportMessage:
        """Send and await the reply that reaches this instance (a callback)."""
        future = await self._run(self.sync.request, destination, body, headers, **kw)
        return await asyncio.wrap_future(future)

    async def publish(
        self,
        event_type: str | Sequence[str] | None,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> str:
        """See PubSub.publish (sdk/transport/pubsub.py)."""
        return await self._run(self.sync.publish, event_type, body, headers, **kw)

    async def subscribe(self, event_type: str, **kw: Any) -> Subscription:
        """See PubSub.subscribe."""
        return await self._run(self.sync.subscribe, event_type, **kw)

    async def unsubscribe(self, event_type: str) -> None:
        """See PubSub.unsubscribe."""
        await self._run(self.sync.unsubscribe, event_type)

    async def subscriptions(self) -> list[Subscription]:
        """See PubSub.subscriptions."""
        return await self._run(self.sync.subscriptions)

    async def receive(self, wait: float | None = 0.0, *, queue: str | None = None) -> TransportMessage | None:
        """See TransportEndpoint.receive."""
        return await self._run(self.sync.receive, wait, queue=queue)

    # --- handling ---------------------------------------------------------------------------

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
                started = datetime.now(timezone.utc)
                handling = True
                with tracing.handling(queue, tx.trace_context, self.sync.runtime.namespace):
                    await handler(msg, atx)
                handling = False
                await self._run(tx.audit, msg, started)  # off the loop: the audit queue's first look-up
            await atx.commit()
            self.sync.receiving_worked()
            if callback is not None:
                callback.set_result(msg)
        except Exception as exc:  # noqa: BLE001 - whatever the application's handler raises: rolled back
            self.sync.handling_failed(tx, queue, exc, receiving=not handling)
            if not handling:
                await asyncio.sleep(self.sync.receive_backoff())
        return True

    async def start(self, handler: AsyncHandler) -> Self:
        """Start the readers of the primary queue (its model, MaximumConcurrencyLevel) and of the
        secondary queue (same model, `secondary_readers`)."""
        s = self.sync.settings
        rt = self.sync.runtime
        if s.send_only:
            raise InvalidArgumentError(f"{s.name} is a send-only endpoint: it does not receive")
        if rt.outbox is not None or rt.transaction_mode is not TransactionMode.SENDS_ATOMIC_WITH_RECEIVE:
            raise InvalidArgumentError(
                "the asyncio endpoint handles in SendsAtomicWithReceive without an outbox; "
                "use the thread endpoint (transport.endpoint) for the others"
            )
        self._stopping.clear()  # started again after a stop
        await self._run(self.sync.start_mover)  # the delayed store's due rows, on its own thread
        queues = [(s.primary_queue, s.max_concurrency)]
        if s.secondary_queue is not None:
            queues.append((s.secondary_queue, s.secondary_readers))
        for queue, n in queues:
            await self._run(self.sync.runtime.receiver, queue)  # joins the group now
            self.running[queue] = self.peak[queue] = self._unclaimed[queue] = 0
            self._slot_freed[queue] = asyncio.Event()
            if s.model == MONITOR:
                self._spawn(self._monitor(queue, handler, n))
            elif s.model == FIXED:
                for _ in range(n):
                    self._spawn(self._reader(queue, handler, None))
            else:
                ramp = {"state": RampUp(max_readers=n)}
                self._spawn(self._reader(queue, handler, ramp))
        return self

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def _enter(self, queue: str) -> None:
        self.running[queue] += 1
        self.peak[queue] = max(self.peak[queue], self.running[queue])

    def _leave(self, queue: str) -> None:
        self.running[queue] -= 1
        self._slot_freed[queue].set()

    async def _reader(self, queue: str, handler: AsyncHandler, ramp: dict[str, RampUp] | None) -> None:
        """fixed (ramp None) or 2.1 (ramp: the queue's shared controller state) reader."""
        self._enter(queue)
        try:
            while not self._stopping.is_set():
                got = await self._handle_one(queue, handler, WAIT)
                if ramp is None:
                    continue
                ramp["state"], delta = ramp["state"].observe(got)
                if delta > 0:
                    self._spawn(self._reader(queue, handler, ramp))
                elif delta < 0:
                    return
        finally:
            self._leave(queue)

    async def _monitor(self, queue: str, handler: AsyncHandler, max_concurrency: int) -> None:
        """3.0: count the waiting messages and start a receive task for each, never more than
        `max_concurrency` at once."""
        receiver = self.sync.runtime.receiver(queue)
        while not self._stopping.is_set():
            waiting = receiver.waiting()
            if not waiting:
                waiting = await self._run(receiver.wait_for_waiting, WAIT)
            start = receive_tasks_to_start(waiting - self._unclaimed[queue], self.running[queue], max_concurrency)
            if start <= 0:
                self._slot_freed[queue].clear()
                if waiting:
                    try:
                        await asyncio.wait_for(self._slot_freed[queue].wait(), WAIT)
                    except TimeoutError:
                        pass
                continue
            for _ in range(start):
                self._enter(queue)
                self._unclaimed[queue] += 1
                self._spawn(self._task(queue, handler))
            await asyncio.sleep(0)  # let the tasks take their messages before counting again

    async def _task(self, queue: str, handler: AsyncHandler) -> None:
        try:
            await self._handle_one(queue, handler, 0.0, task=True)
        finally:
            self._leave(queue)

    def stats(self) -> dict[str, Any]:
        """TransportEndpoint.stats with the receive tasks running now and at most, per queue."""
        return {**self.sync.stats(), "running": dict(self.running), "peak": dict(self.peak)}

    async def stop(self) -> None:
        """Stop the readers after their current messages."""
        self._stopping.set()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Stop the readers, then close the endpoint underneath."""
        await self.stop()
        await asyncio.to_thread(self.sync.close)
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
