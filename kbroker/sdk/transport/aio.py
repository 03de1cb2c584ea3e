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
from typing import Any, Mapping, Self, TypeVar

from kbroker.core.activation.ramp import RampUp
from kbroker.core.transport.endpoint import FIXED, MONITOR, receive_tasks_to_start
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.subscriptions import Subscription
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.aio_handling import AsyncHandler, AsyncHandling
from kbroker.sdk.transport.aio_transaction import AsyncTransportTransaction
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.endpoint import endpoint as sync_endpoint

__all__ = ["AsyncHandler", "AsyncTransportEndpoint", "AsyncTransportTransaction", "endpoint"]

log = logging.getLogger("kbroker.transport")
T = TypeVar("T")
WAIT = 1.0


async def endpoint(name: str, **kwargs: Any) -> AsyncTransportEndpoint:
    """An endpoint instance (see TransportEndpoint), connected off the event loop by the broker
    rule (see sdk.transport.endpoint)."""
    return AsyncTransportEndpoint(await asyncio.to_thread(sync_endpoint, name, **kwargs))


class AsyncTransportEndpoint(AsyncHandling):
    """An endpoint instance for asyncio code; `sync` is the TransportEndpoint underneath.
    After start(), `running` and `peak` give the primary queue's receive tasks now and at most."""

    def __init__(self, ep: TransportEndpoint):
        self.sync = ep
        s = ep.settings
        self._pool_size = s.max_concurrency + s.secondary_readers + 4
        self._pool = concurrent.futures.ThreadPoolExecutor(self._pool_size, thread_name_prefix=f"kbroker-aio-{s.name}")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._unclaimed: dict[str, int] = {}
        self._slot_freed: dict[str, asyncio.Event] = {}  # per queue: one of its readers or tasks ended
        self._max: dict[str, int] = {}  # per queue: its MaximumConcurrencyLevel now (change_concurrency)
        self._retire: dict[str, int] = {}  # per queue: readers to stop after their current message
        self._ramps: dict[str, dict[str, RampUp]] = {}
        self._handler: AsyncHandler | None = None

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

    async def start(self, handler: AsyncHandler) -> Self:
        """Start the readers of the primary queue (its model, MaximumConcurrencyLevel) and of the
        secondary queue (same model, `secondary_readers`)."""
        s = self.sync.settings
        rt = self.sync.runtime
        if s.send_only:
            raise InvalidArgumentError(f"{s.name} is a send-only endpoint: it does not receive")
        if rt.outbox is not None:
            if not getattr(rt.outbox, "asynchronous", False):
                raise InvalidArgumentError(
                    "the asyncio endpoint takes an AsyncOutbox (sdk/transport/aio_outbox.py) over an AsyncEngine:"
                    " an Outbox's database calls would block the event loop"
                )
            await rt.outbox.setup()
        self._stopping.clear()  # started again after a stop
        await self._run(self.sync.start_mover)  # the delayed store's due rows, on its own thread
        await self._run(self.sync.start_bridges)
        await self._run(self.sync.startup_purge.run, self.sync)  # before the readers, if enabled
        queues = [(s.primary_queue, s.max_concurrency)]
        if s.secondary_queue is not None:
            queues.append((s.secondary_queue, s.secondary_readers))
        self._handler = handler
        for queue, n in queues:
            await self._run(self.sync.runtime.receiver, queue)  # joins the group now
            self.running[queue] = self.peak[queue] = self._unclaimed[queue] = self._retire[queue] = 0
            self._max[queue] = n
            self._slot_freed[queue] = asyncio.Event()
            if s.model == MONITOR:
                self._spawn(self._monitor(queue, handler))
            elif s.model == FIXED:
                for _ in range(n):
                    self._spawn(self._reader(queue, handler, None))
            else:
                self._ramps[queue] = {"state": RampUp(max_readers=n)}
                self._spawn(self._reader(queue, handler, self._ramps[queue]))
        return self

    async def change_concurrency(self, max_concurrency: int) -> None:
        """TransportEndpoint.change_concurrency: the primary queue's MaximumConcurrencyLevel, now."""
        self.sync.change_concurrency(max_concurrency)  # validates it; kept for the next start
        s = self.sync.settings
        if s.max_concurrency + s.secondary_readers + 4 > self._pool_size:
            self._pool_size = s.max_concurrency + s.secondary_readers + 4
            old, self._pool = (
                self._pool,
                concurrent.futures.ThreadPoolExecutor(self._pool_size, thread_name_prefix=f"kbroker-aio-{s.name}"),
            )
            old.shutdown(wait=False)  # its running calls finish; new ones go to the bigger pool
        queue = s.primary_queue
        if queue not in self._max or self._stopping.is_set() or self._handler is None:
            return
        before, self._max[queue] = self._max[queue], max_concurrency
        if s.model == FIXED:
            readers = self.running[queue] - self._retire[queue]
            for _ in range(max_concurrency - readers):
                self._spawn(self._reader(queue, self._handler, None))
            self._retire[queue] += max(0, readers - max_concurrency)
        elif s.model != MONITOR:
            ramp = self._ramps[queue]
            ramp["state"], delta = ramp["state"].with_max(max_concurrency)
            self._retire[queue] += max(0, -delta)
        if max_concurrency != before:
            self._slot_freed[queue].set()

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
                if self._retire[queue] > 0:  # the maximum was lowered
                    self._retire[queue] -= 1
                    return
                if ramp is None:
                    continue
                ramp["state"], delta = ramp["state"].observe(got)
                if delta > 0:
                    self._spawn(self._reader(queue, handler, ramp))
                elif delta < 0:
                    return
        finally:
            self._leave(queue)

    async def _monitor(self, queue: str, handler: AsyncHandler) -> None:
        """3.0: count the waiting messages and start a receive task for each, never more than
        the queue's maximum (`_max`) at once."""
        receiver = self.sync.runtime.receiver(queue)
        while not self._stopping.is_set():
            waiting = receiver.waiting()
            if not waiting:
                waiting = await self._run(receiver.wait_for_waiting, WAIT)
            start = receive_tasks_to_start(waiting - self._unclaimed[queue], self.running[queue], self._max[queue])
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
