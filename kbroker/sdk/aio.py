"""asyncio API: the same statements, awaited.

    broker = await kbroker.aio.connect()
    async with broker.transaction() as tx:
        for msg in await tx.receive("ExpenseQueue", top=10, wait=5): ...
        await tx.send(handle, reply_type, body)

The runtime underneath is the thread-based one (poll thread, group committer); each blocking
statement runs in a worker thread, so an event loop keeps serving other coroutines while a
RECEIVE waits or a commit is under way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kbroker.core.envelope import Message
from kbroker.sdk import broker as client
from kbroker.sdk.transaction import Transaction


async def connect(bootstrap: str | None = None, namespace: str | None = None, **kwargs: Any) -> "AsyncBroker":
    return AsyncBroker(await asyncio.to_thread(client.connect, bootstrap, namespace, **kwargs))


class AsyncTransaction:
    def __init__(self, tx: Transaction):
        self.sync = tx

    async def receive(self, queue: str, top: int = 1, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        return await asyncio.to_thread(self.sync.receive, queue, top, wait, **kw)

    async def send(self, handle: str, message_type: str = "DEFAULT", body: Any = None, **kw: Any) -> str:
        return self.sync.send(handle, message_type, body, **kw)  # held until commit: no I/O

    async def begin_dialog(self, *args: Any, **kw: Any) -> str:
        return await asyncio.to_thread(self.sync.begin_dialog, *args, **kw)

    async def end_conversation(self, handle: str, **kw: Any) -> None:
        await asyncio.to_thread(self.sync.end_conversation, handle, **kw)

    async def move_conversation(self, handle: str, group: str) -> None:
        await asyncio.to_thread(self.sync.move_conversation, handle, group)

    async def commit(self) -> None:
        await asyncio.to_thread(self.sync.commit)

    async def rollback(self) -> None:
        await asyncio.to_thread(self.sync.rollback)

    async def __aenter__(self) -> "AsyncTransaction":
        return self

    async def __aexit__(self, exc_type: Any, *_: Any) -> None:
        if self.sync.state != "open":
            return
        await (self.commit() if exc_type is None else self.rollback())


class AsyncBroker:
    def __init__(self, broker: client.Broker):
        self.sync = broker

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self.sync.transaction())

    async def begin_dialog(self, *args: Any, **kw: Any) -> str:
        return await asyncio.to_thread(self.sync.begin_dialog, *args, **kw)

    async def send(self, handle: str, message_type: str = "DEFAULT", body: Any = None, **kw: Any) -> str:
        return await asyncio.to_thread(self.sync.send, handle, message_type, body, **kw)

    async def receive(self, queue: str, top: int = 1, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        return await asyncio.to_thread(self.sync.receive, queue, top, wait, **kw)

    async def end_conversation(self, handle: str, **kw: Any) -> None:
        await asyncio.to_thread(self.sync.end_conversation, handle, **kw)

    async def move_conversation(self, handle: str, group: str) -> None:
        await asyncio.to_thread(self.sync.move_conversation, handle, group)

    async def queue_messages(self, queue: str, conversation_handle: str | None = None) -> list[dict]:
        return await asyncio.to_thread(self.sync.queue_messages, queue, conversation_handle)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> "AsyncBroker":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
