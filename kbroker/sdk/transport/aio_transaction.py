"""A transport transaction for asyncio code: TransportTransaction's statements, awaited, run
off the event loop by the endpoint's runner (sdk/transport/aio.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Mapping, Protocol, Self, TypeVar

from kbroker.core.transport.message import TransportMessage
from kbroker.sdk.transport.transaction import TransportTransaction

T = TypeVar("T")


class Runner(Protocol):
    """How a transaction's statements are run off the event loop: fn(*args, **kw), awaited."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kw: Any) -> Awaitable[T]: ...


class AsyncTransportTransaction:
    """A TransportTransaction whose blocking statements are awaited; `sync` is underneath."""

    def __init__(self, tx: TransportTransaction, run: Runner):
        self.sync, self._run = tx, run

    @property
    def db(self) -> Any:
        """With an AsyncOutbox: the application's database connection (an AsyncConnection), in
        the transaction that stores this handling's sends."""
        return self.sync.db

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
