"""The asyncio endpoint's outbox (sdk/transport/aio_outbox.py, sdk/transport/aio_handling.py)
against the real broker and a real SQLite database through aiosqlite: a coroutine handler's
awaited database write and its sends happen exactly once, a failed attempt's write rolls back
with it, duplicates of the message are dropped; each endpoint refuses the other's outbox. (The
kill -9 between the database commit and the dispatch: test_transport_outbox.py, both kinds.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import Recoverability
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.aio_outbox import AsyncOutbox
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.outbox import Outbox
from tests.helpers.transport_faces import Face, make_faces, received

NO_DELAYED = Recoverability(immediate_retries=1, delayed_retries=0)


@pytest.fixture
def aio_faces(kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., Face]]:
    make, close = make_faces("asyncio", kafka_bootstrap, namespace)
    yield make
    close()


def test_an_asyncio_outbox_handler_writes_and_sends_once_and_drops_duplicates(
    aio_faces: Callable[..., Face], tmp_path: Path
) -> None:
    db = tmp_path / "app.db"
    with sa.create_engine(f"sqlite:///{db}").begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (n TEXT NOT NULL)"))
    outbox = AsyncOutbox(create_async_engine(f"sqlite+aiosqlite:///{db}"))
    calls: Counter[bytes | None] = Counter()

    async def handle(msg: TransportMessage, tx: Any) -> None:
        calls[msg.body] += 1
        await tx.db.execute(sa.text("INSERT INTO orders (n) VALUES (:n)"), {"n": (msg.body or b"").decode()})
        await asyncio.sleep(0)  # inside the database transaction, the loop's other tasks may run
        await tx.send("Out", msg.body)
        if msg.body == b"fails once" and calls[msg.body] == 1:
            raise RuntimeError("after the write: rolled back with it")

    out = aio_faces("Out")
    billing = aio_faces("Billing", outbox=outbox, recoverability=NO_DELAYED)
    billing.start_raw(lambda msg, tx: None, handle)
    first = billing.send("Billing", b"a")
    billing.send("Billing", b"a again", message_id=first)  # a sender's duplicate: same Id
    billing.send("Billing", b"fails once")
    got = received(out, 2, 20.0)
    got += received(out, 1, 3.0)  # nothing more comes
    assert sorted(m.body for m in got) == [b"a", b"fails once"]
    with sa.create_engine(f"sqlite:///{db}").connect() as conn:
        rows = sorted(r[0] for r in conn.execute(sa.text("SELECT n FROM orders")))
    assert rows == ["a", "fails once"]  # the failed attempt's write rolled back; the duplicate never ran
    assert calls == {b"a": 1, b"fails once": 2}
    assert billing.sync.stats()["counters"]["duplicates_dropped"] == 1
    stored = Outbox(sa.create_engine(f"sqlite:///{db}")).rows()  # the same table, read by the thread one
    assert len(stored) == 2 and all(r["dispatched_at"] is not None for r in stored)


def test_each_endpoint_refuses_the_other_kinds_outbox(
    aio_faces: Callable[..., Face], endpoints: Callable[..., TransportEndpoint], tmp_path: Path
) -> None:
    aio_outbox = AsyncOutbox(create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"))
    with pytest.raises(InvalidArgumentError, match="AsyncOutbox is the asyncio endpoint's"):
        endpoints("ThreadsWithAsync", outbox=aio_outbox).start(lambda msg, tx: None)
    face = aio_faces("AsyncWithThreads", outbox=Outbox(sa.create_engine(f"sqlite:///{tmp_path / 't.db'}")))

    async def handle(msg: TransportMessage, tx: Any) -> None:
        return None

    with pytest.raises(InvalidArgumentError, match="takes an AsyncOutbox"):
        face.start_raw(lambda msg, tx: None, handle)
