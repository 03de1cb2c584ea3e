"""The two endpoints under test as one (tests/integration/test_transport_contract*.py): the
thread one (sdk/transport/endpoint.py) and the asyncio one (sdk/transport/aio.py), behind one API
whose handler and on_error logic is plain code either way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import ErrorResult, Recoverability
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.on_error import ErrorContext

QUICK = Recoverability(immediate_retries=2, delayed_retries=1, time_increase=0.3)
Send = Callable[..., None]
Logic = Callable[[TransportMessage, Send], None]  # what a test's handler does, on either endpoint
OnError = Callable[[ErrorContext, Send], "ErrorResult | None"]  # what a test's on_error does


class Face:
    """One endpoint under test, the thread or the asyncio one, behind one API: start(logic),
    stop(), send(); `logic(msg, send)` is plain code either way."""

    def __init__(
        self, kind: str, name: str, bootstrap: str, namespace: str, on_error: OnError | None = None, **kw: Any
    ):
        self.kind = kind
        kw.setdefault("recoverability", QUICK)
        if on_error is not None:
            kw["on_error"] = self._on_error(kind, on_error)
        self.sync = TransportEndpoint(name, cluster=bootstrap, namespace=namespace, machine="c1", install=True, **kw)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.aio: Any = None
        if kind == "asyncio":
            from kbroker.sdk.transport.aio import AsyncTransportEndpoint

            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True).start()
            self.aio = AsyncTransportEndpoint(self.sync)

    @staticmethod
    def _on_error(kind: str, logic: OnError) -> Callable[[ErrorContext], Any]:
        if kind != "asyncio":
            return lambda ctx: logic(ctx, ctx.transaction.send)

        async def on_error(ctx: ErrorContext) -> ErrorResult | None:  # a coroutine, as asyncio code writes it
            sends: list[tuple[Any, ...]] = []
            result = logic(ctx, lambda *a, **kw: sends.append((a, kw)))
            for a, kw in sends:
                await ctx.transaction.send(*a, **kw)
            return result

        return on_error

    def _await(self, coro: Any, timeout: float = 60.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, logic: Logic) -> Face:
        if self.aio is None:
            self.sync.start(lambda msg, tx: logic(msg, tx.send))
            return self

        async def handle(msg: TransportMessage, tx: Any) -> None:
            sends: list[tuple[Any, ...]] = []
            logic(msg, lambda *a, **kw: sends.append((a, kw)))
            for a, kw in sends:
                await tx.send(*a, **kw)

        self._await(self.aio.start(handle))
        return self

    def start_raw(
        self, handler: Callable[[TransportMessage, Any], None], ahandler: Callable[..., Awaitable[None]]
    ) -> Face:
        """Start with a handler of each kind (`ahandler`: a coroutine function)."""
        if self.aio is None:
            self.sync.start(handler)
        else:
            self._await(self.aio.start(ahandler))
        return self

    def change_concurrency(self, n: int) -> None:
        if self.aio is None:
            self.sync.change_concurrency(n)
        else:
            self._await(self.aio.change_concurrency(n))

    def stop(self) -> None:
        if self.aio is None:
            self.sync.stop()
        else:
            self._await(self.aio.stop())

    def send(self, *a: Any, **kw: Any) -> str:
        return self.sync.send(*a, **kw)

    def close(self) -> None:
        if self.aio is None:
            self.sync.close()
        else:
            self._await(self.aio.close())
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture(params=["threads", "asyncio"])
def faces(request: pytest.FixtureRequest, kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., Face]]:
    made: list[Face] = []

    def make(name: str, **kw: Any) -> Face:
        face = Face(request.param, name, kafka_bootstrap, namespace, **kw)
        made.append(face)
        return face

    yield make
    for f in reversed(made):
        f.close()


def received(face: Face, n: int, seconds: float = 20.0, queue: str | None = None) -> list[TransportMessage]:
    got: list[TransportMessage] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        msg = face.sync.receive(0.3, queue=queue)
        if msg is not None:
            got.append(msg)
    return got


def make_faces(kind: str, bootstrap: str, namespace: str) -> tuple[Callable[..., Face], Callable[[], None]]:
    """A maker of faces of `kind` and what closes every face it made."""
    made: list[Face] = []

    def make(name: str, **kw: Any) -> Face:
        face = Face(kind, name, bootstrap, namespace, **kw)
        made.append(face)
        return face

    def close() -> None:
        for f in reversed(made):
            f.close()

    return make, close


def received(face: Face, n: int, seconds: float = 20.0, queue: str | None = None) -> list[TransportMessage]:
    """Up to `n` messages of `queue` (the face's primary queue), received within `seconds`."""
    got: list[TransportMessage] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        msg = face.sync.receive(0.3, queue=queue)
        if msg is not None:
            got.append(msg)
    return got
