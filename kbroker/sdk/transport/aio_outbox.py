"""The outbox for the asyncio endpoint: Outbox (sdk/transport/outbox.py) over SQLAlchemy's
AsyncEngine, so a handler's database calls are awaited on the event loop instead of blocking it.
The same table, the same rows and the same rules: the handler runs inside a transaction of the
application's database, writes through `tx.db` (an AsyncConnection: `await tx.db.execute(...)`),
its sends are stored in that transaction and dispatched with the message's removal.

    outbox = AsyncOutbox(create_async_engine("postgresql+asyncpg://..."))   # or sqlite+aiosqlite
    ep = await transport.async_endpoint("Billing", outbox=outbox)
    await ep.start(handle)                      # async handle(msg, tx): await tx.db.execute, tx.send
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from kbroker.core.records import Record
from kbroker.core.transport.outbox_rows import KEEP, Stored
from kbroker.sdk.transport.outbox import OutboxTable


class AsyncOutbox:
    """The outbox table in the application's database, through an AsyncEngine (created if
    missing when the endpoint starts: setup()).

    Parameters
    ----------
    engine: a SQLAlchemy AsyncEngine of the application's database (aiosqlite, asyncpg, ...).
    keep: seconds a dispatched row is kept, so a duplicate of its message is dropped (7 days).
    on_stored: called with a message's Id after the database commit, before the dispatch (for
        metrics; the kill -9 test stops the process there)."""

    asynchronous = True

    def __init__(
        self, engine: AsyncEngine, *, keep: float = KEEP, on_stored: Callable[[str], None] | None = None
    ) -> None:
        self.engine = engine
        self.keep = keep
        self.on_stored = on_stored or (lambda mid: None)
        self.sql = OutboxTable()
        self._ready = False

    async def setup(self) -> None:
        """Create the table if it is missing (the asyncio endpoint's start calls it)."""
        if not self._ready:
            async with self.engine.begin() as conn:
                await conn.run_sync(self.sql.meta.create_all)
            self._ready = True

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction of the application's database (committed when the block ends)."""
        async with self.engine.begin() as conn:
            yield conn

    async def get(self, conn: AsyncConnection, endpoint: str, message_id: str) -> Stored | None:
        found = await conn.execute(self.sql.select, self.sql.key(endpoint, message_id))
        return self.sql.stored(found.first())

    async def store(
        self, conn: AsyncConnection, endpoint: str, message_id: str, records: list[Record], source: str
    ) -> None:
        """The handling's outgoing messages, in the handler's database transaction."""
        await conn.execute(self.sql.insert, self.sql.values(endpoint, message_id, records, source))

    async def dispatched(self, endpoint: str, message_id: str) -> None:
        """Mark the row dispatched: its messages went with the incoming message's removal."""
        async with self.engine.begin() as conn:
            await conn.execute(self.sql.mark, {**self.sql.key(endpoint, message_id), "at": time.time()})

    async def clean(self, now: float | None = None) -> int:
        """Delete the rows dispatched more than `keep` seconds ago; how many."""
        async with self.engine.begin() as conn:
            done = await conn.execute(self.sql.older, self.sql.cut(self.keep, now))
            return int(done.rowcount or 0)

    async def rows(self) -> list[dict[str, Any]]:
        """Every row: endpoint, message_id, stored_at, dispatched_at."""
        async with self.engine.connect() as conn:
            return [dict(r._mapping) for r in (await conn.execute(self.sql.listing)).all()]
