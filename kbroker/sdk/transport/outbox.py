"""The outbox: a handler that writes to the application's database, and sends, exactly once.

A Kafka transaction cannot hold a database write. So, as NServiceBus's outbox does, the
handler runs inside a transaction of the application's database (SQLAlchemy: SQLite,
PostgreSQL, ...): its writes go through `tx.db`, and its outgoing messages are stored in the
outbox table in that same database transaction, keyed by the incoming message's Id. Once the
database committed, the messages are dispatched in the Kafka transaction that removes the
incoming message, and the row is marked dispatched.

- A crash (kill -9) after the database commit and before the Kafka commit: the message comes
  back; its outbox row is there, so the handler does not run again and the stored messages are
  dispatched, once, with its removal.
- The same message received again (a sender's duplicate: another record with its Id): its row
  says so and it is removed without running the handler, for `keep` seconds (7 days) after it
  was dispatched. The row remembers which record it was stored for, so a duplicate read while
  the first copy is between its database commit and its dispatch is dropped too, rather than
  taken for that record back after a crash. Two copies handled at once both run the handler,
  and the second's insert of the row fails on its key: it rolls back and, retried, is dropped.
- A crash after the Kafka commit and before the row is marked: the message is gone (removed
  with the dispatch); the row, still unmarked, would dispatch the messages again only for a
  duplicate of the message, as in NServiceBus, whose receivers' outboxes drop such copies.

    outbox = Outbox(sqlalchemy.create_engine("postgresql+psycopg://..."))
    ep = transport.endpoint("Billing", outbox=outbox).start(handle)   # handle(msg, tx): tx.db, tx.send

The asyncio endpoint takes an AsyncOutbox (sdk/transport/aio_outbox.py) over an AsyncEngine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from kbroker.core.records import Record
from kbroker.core.transport.outbox_rows import KEEP, Stored, decode, encode

TABLE = "kbroker_outbox"


class OutboxTable:
    """The table `kbroker_outbox` and its statements, built once (building them per message cost
    about 5 ms of SQLAlchemy's Python in the outbox bench), for Outbox and AsyncOutbox alike."""

    def __init__(self) -> None:
        self.meta = sa.MetaData()
        t = self.table = sa.Table(
            TABLE,
            self.meta,
            sa.Column("endpoint", sa.String(150), primary_key=True),
            sa.Column("message_id", sa.String(36), primary_key=True),
            sa.Column("stored_at", sa.Float, nullable=False),
            sa.Column("dispatched_at", sa.Float, nullable=True, index=True),
            sa.Column("operations", sa.LargeBinary, nullable=False),
            sa.Column("source", sa.String(400), nullable=False),  # the record it was stored for
        )
        row = (t.c.endpoint == sa.bindparam("ep")) & (t.c.message_id == sa.bindparam("mid"))
        self.select = sa.select(t.c.operations, t.c.dispatched_at, t.c.source).where(row)
        self.insert = t.insert()
        self.mark = t.update().where(row).values(dispatched_at=sa.bindparam("at"))
        self.older = t.delete().where(t.c.dispatched_at < sa.bindparam("cut"))
        self.listing = sa.select(t.c.endpoint, t.c.message_id, t.c.stored_at, t.c.dispatched_at)

    @staticmethod
    def key(endpoint: str, message_id: str) -> dict[str, Any]:
        return {"ep": endpoint, "mid": message_id}

    @staticmethod
    def stored(row: Any) -> Stored | None:
        return None if row is None else Stored(decode(row.operations), row.dispatched_at is not None, row.source)

    @staticmethod
    def values(endpoint: str, message_id: str, records: list[Record], source: str) -> dict[str, Any]:
        return {
            "endpoint": endpoint,
            "message_id": message_id,
            "stored_at": time.time(),
            "operations": encode(records),
            "source": source,
        }

    def cut(self, keep: float, now: float | None) -> dict[str, float]:
        return {"cut": (time.time() if now is None else now) - keep}


class Outbox:
    """The outbox table in the application's database (created if missing), for the thread
    endpoint; the asyncio endpoint's is AsyncOutbox (sdk/transport/aio_outbox.py).

    Parameters
    ----------
    engine: a SQLAlchemy engine of the application's database.
    keep: seconds a dispatched row is kept, so a duplicate of its message is dropped (7 days).
    on_stored: called with a message's Id after the database commit, before the dispatch (for
        metrics; the kill -9 test stops the process there)."""

    asynchronous = False

    def __init__(self, engine: sa.Engine, *, keep: float = KEEP, on_stored: Callable[[str], None] | None = None):
        self.engine = engine
        self.keep = keep
        self.on_stored = on_stored or (lambda mid: None)
        self.sql = OutboxTable()
        self.table = self.sql.table
        self.sql.meta.create_all(engine)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A transaction of the application's database (committed when the block ends)."""
        with self.engine.begin() as conn:
            yield conn

    def get(self, conn: sa.Connection, endpoint: str, message_id: str) -> Stored | None:
        return self.sql.stored(conn.execute(self.sql.select, self.sql.key(endpoint, message_id)).first())

    def store(self, conn: sa.Connection, endpoint: str, message_id: str, records: list[Record], source: str) -> None:
        """The handling's outgoing messages, in the handler's database transaction; `source`:
        the incoming record's place (source_of)."""
        conn.execute(self.sql.insert, self.sql.values(endpoint, message_id, records, source))

    def dispatched(self, endpoint: str, message_id: str) -> None:
        """Mark the row dispatched: its messages went with the incoming message's removal."""
        with self.engine.begin() as conn:
            conn.execute(self.sql.mark, {**self.sql.key(endpoint, message_id), "at": time.time()})

    def clean(self, now: float | None = None) -> int:
        """Delete the rows dispatched more than `keep` seconds ago; how many."""
        with self.engine.begin() as conn:
            return int(conn.execute(self.sql.older, self.sql.cut(self.keep, now)).rowcount or 0)

    def rows(self) -> list[dict[str, Any]]:
        """Every row, for the tests and the curious: endpoint, message_id, stored_at, dispatched_at."""
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(self.sql.listing).all()]
