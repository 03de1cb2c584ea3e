"""asyncio API: the same statements, awaited.

    broker = await kbroker.aio.connect()
    async with broker.transaction() as tx:
        for msg in await tx.receive("ExpenseQueue", top=10, wait=5): ...
        await tx.send(handle, reply_type, body)

The runtime underneath is the thread-based one (poll thread, group committer). Every statement
that may block runs in a worker thread of the broker's own executor (`concurrency` threads, made
as they are needed), never on the event loop: a RECEIVE waits, a commit waits for Kafka, a catalog
or endpoint lookup reads a topic, and SEND, END CONVERSATION, BEGIN CONVERSATION TIMER and MOVE
CONVERSATION wait up to the broker's lock_timeout for a conversation lock another transaction
holds (core/dialogs/locks.py). Other coroutines keep running meanwhile.

The executor is the broker's, not the loop's default one (min(32, CPUs + 4) threads: 6 on two
cores): a statement holds its thread only while it blocks (a RECEIVE waiting for a group, a
commit waiting for the group commit's Kafka transaction), so with the default executor six such
waits stalled every other reader, however many coroutines ran. Readers that await I/O between
statements need far fewer threads than readers; `concurrency` bounds the statements blocked at
once, and the group commit batches their commits into one Kafka transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar, overload

from kbroker.core.catalog.models import Catalog
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import Message
from kbroker.errors import InvalidArgumentError
from kbroker.sdk import broker as client
from kbroker.sdk import group_batches
from kbroker.sdk.partial import Handles
from kbroker.sdk.transaction import Transaction

T = TypeVar("T")

CONCURRENCY = 64  # statements of one AsyncBroker blocked at once (its executor's threads)
WAIT_SLICE = 0.05  # the longest an awaited RECEIVE waits in a thread before it lets others have it


async def connect(
    bootstrap: ClusterLike | None = None, namespace: str | None = None, *, concurrency: int = CONCURRENCY, **kwargs: Any
) -> AsyncBroker:
    """Connect by the broker rule (see kbroker.sdk.broker.connect), off the event loop.
    `concurrency`: how many of its statements may block at once (threads of its executor)."""
    return AsyncBroker(await asyncio.to_thread(client.connect, bootstrap, namespace, **kwargs), concurrency=concurrency)


Run = Callable[..., Any]  # AsyncBroker.run: a blocking call, awaited on the broker's executor


class AsyncTransaction:
    """A Transaction whose statements are awaited; `sync` is the Transaction underneath.

    Statements of one transaction run one at a time, in its worker threads. A statement whose
    awaiting task is cancelled still runs to its end in its thread (a thread cannot be stopped);
    the next statement of the transaction (the rollback of `async with`, typically) waits for it,
    so a rollback never races a SEND that is still taking its conversation lock."""

    def __init__(self, tx: Transaction, run: Run | None = None):
        self.sync = tx
        self._statement = threading.Lock()  # one statement of this transaction at a time
        self._in_thread: Run = run or asyncio.to_thread

    async def _run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        def statement() -> T:
            with self._statement:
                return fn(*args, **kw)

        result: T = await self._in_thread(statement)
        return result

    @property
    def state(self) -> str:
        """Where the transaction is: open, committed, rolled back or aborted."""
        return self.sync.state

    @property
    def committed_at(self) -> float | None:
        """When the commit's Kafka transaction committed (None until then)."""
        return self.sync.committed_at

    async def endpoint(self, handle: str) -> Endpoint:
        """The conversation endpoint as this transaction sees it."""
        return await self._run(self.sync.endpoint, handle)

    async def receive(
        self,
        queue: str,
        top: int | None = None,
        wait: float | None = 0.0,
        *,
        conversation_group: str | None = None,
        conversation_handle: str | None = None,
        instance: str | None = None,
    ) -> list[Message]:
        """RECEIVE TOP(top) FROM queue, WAITFOR(wait seconds; None = no time-out).

        The wait is taken in slices of WAIT_SLICE s, each a RECEIVE of its own in a thread, with
        the event loop free in between: a RECEIVE waiting for a group holds a thread only that
        long, so readers waiting on a busy queue never take every thread from the readers that
        hold a group and need one to SEND and commit it (with more coroutines than threads, whole
        waits did, until each timed out)."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            piece = WAIT_SLICE if left is None else min(left, WAIT_SLICE)
            got = await self._run(
                self.sync.receive,
                queue,
                top,
                piece,
                conversation_group=conversation_group,
                conversation_handle=conversation_handle,
                instance=instance,
            )
            if got or (deadline is not None and time.monotonic() >= deadline):
                return got

    async def receive_groups(
        self, queue: str, groups: int, top: int | None = None, wait: float | None = 0.0, *, within: float = 0.0
    ) -> list[list[Message]]:
        """Transaction.receive_groups awaited: the first group's wait in slices, as receive()'s;
        the others in one thread call, which holds its thread up to `within` s."""
        group_batches.check(groups, within)
        batches: dict[str, list[Message]] = {}
        group_batches.add(batches, await self.receive(queue, top, wait))
        return await self._run(group_batches.more, self.sync, queue, batches, groups, top, within)

    async def get_conversation_group(self, queue: str, wait: float | None = 0.0) -> str | None:
        """GET CONVERSATION GROUP: lock the next ready group without receiving from it."""
        return await self._run(self.sync.get_conversation_group, queue, wait)

    async def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG within the transaction: returns the initiator's conversation handle."""
        return await self._run(self.sync.begin_dialog, from_service, to_service, contract, **kw)

    @overload
    async def send(self, handle: str, message_type: str = ..., body: Any = ..., **kw: Any) -> str:
        """SEND ON CONVERSATION handle: its message id."""

    @overload
    async def send(self, handle: Handles, message_type: str = ..., body: Any = ..., **kw: Any) -> list[str]:
        """SEND ON CONVERSATION (h1, h2, ...): their message ids, in order."""

    async def send(
        self, handle: str | Handles, message_type: str = "DEFAULT", body: Any = None, **kw: Any
    ) -> str | list[str]:
        """SEND ON CONVERSATION: held until commit; waits for the conversation lock first. A list
        of handles sends on each, all or none (Transaction.send)."""
        return await self._run(self.sync.send, handle, message_type, body, **kw)

    async def savepoint(self, name: str) -> None:
        """SAVE TRANSACTION name (Transaction.savepoint)."""
        await self._run(self.sync.savepoint, name)

    async def rollback_to(self, name: str) -> None:
        """ROLLBACK TRANSACTION name: undo what came after the savepoint, keeping every lock
        (Transaction.rollback_to); SavepointNotFoundError for a name the transaction lacks."""
        await self._run(self.sync.rollback_to, name)

    async def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER: armed when the transaction commits; arming again replaces it."""
        await self._run(self.sync.begin_conversation_timer, handle, timeout)

    async def end_conversation(
        self, handle: str, *, error: int | None = None, description: str | None = None, cleanup: bool = False
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP]."""
        await self._run(self.sync.end_conversation, handle, error=error, description=description, cleanup=cleanup)

    async def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group."""
        await self._run(self.sync.move_conversation, handle, group)

    async def commit(self) -> None:
        """COMMIT: returns when the Kafka transaction committed."""
        await self._run(self.sync.commit)

    async def rollback(self) -> None:
        """ROLLBACK: drops what was held and gives the received messages back."""
        await self._run(self.sync.rollback)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.sync.state != "open":
            return
        await (self.commit() if exc_type is None else self.rollback())


class AsyncBroker:
    """A Broker whose statements are awaited; `sync` is the Broker underneath (it may be shared
    with threads that use it directly: conversation and group locks hold across both)."""

    def __init__(self, broker: client.Broker, *, concurrency: int = CONCURRENCY):
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgumentError(f"concurrency must be a whole number of at least 1, not {concurrency!r}")
        self.sync = broker
        self.concurrency = concurrency
        self._executor = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="kbroker-aio")

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Await the blocking call fn(*args, **kw) on this broker's executor."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kw))

    @property
    def cluster(self) -> Cluster:
        """The Kafka cluster the broker talks to."""
        return self.sync.cluster

    @property
    def bootstrap(self) -> str:
        """The cluster's address, as text."""
        return self.sync.bootstrap

    @property
    def namespace(self) -> str:
        """The namespace (topic prefix and catalog) the broker works in."""
        return self.sync.namespace

    def transaction(self) -> AsyncTransaction:
        """BEGIN TRANSACTION: use with `async with`, or await commit()/rollback()."""
        return AsyncTransaction(self.sync.transaction(), self.run)  # no I/O: the statements do it

    async def catalog(self) -> Catalog:
        """The namespace's catalog (read from Kafka on first use)."""
        return await self.run(lambda: self.sync.catalog)

    async def refresh_catalog(self) -> Catalog:
        """Read the catalog again."""
        return await self.run(self.sync.refresh_catalog)

    async def queue_enabled(self, queue: str) -> bool:
        """STATUS of a queue (a disabled one is re-checked against the catalog)."""
        return await self.run(self.sync.runtime.queue_enabled, queue)

    async def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG: creates the initiator endpoint and returns its conversation handle."""
        return await self.run(self.sync.begin_dialog, from_service, to_service, contract, **kw)

    @overload
    async def send(self, handle: str, message_type: str = ..., body: Any = ..., **kw: Any) -> str:
        """SEND ON CONVERSATION handle: its message id."""

    @overload
    async def send(self, handle: Handles, message_type: str = ..., body: Any = ..., **kw: Any) -> list[str]:
        """SEND ON CONVERSATION (h1, h2, ...): their message ids, in order."""

    async def send(
        self, handle: str | Handles, message_type: str = "DEFAULT", body: Any = None, **kw: Any
    ) -> str | list[str]:
        """SEND ON CONVERSATION: returns the message id once Kafka acknowledged the message (a list
        of handles: their ids, once the one transaction that sends on each committed)."""
        return await self.run(self.sync.send, handle, message_type, body, **kw)

    async def receive(self, queue: str, top: int | None = None, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        """RECEIVE outside a transaction: a transaction of its own, committed before it returns."""
        return await self.run(self.sync.receive, queue, top, wait, **kw)

    async def end_conversation(
        self, handle: str, *, error: int | None = None, description: str | None = None, cleanup: bool = False
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP]."""
        await self.run(self.sync.end_conversation, handle, error=error, description=description, cleanup=cleanup)

    async def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds."""
        await self.run(self.sync.begin_conversation_timer, handle, timeout)

    async def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group, committed before it returns."""
        await self.run(self.sync.move_conversation, handle, group)

    async def queue_messages(self, queue: str, conversation_handle: str | None = None) -> list[dict[str, Any]]:
        """The queue's messages like Service Broker's queue view."""
        return await self.run(self.sync.queue_messages, queue, conversation_handle)

    async def close(self) -> None:
        """Close the receivers and the committer, and write the endpoints' exact sequences."""
        try:
            await self.run(self.sync.close)
        finally:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
