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
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from kbroker.core.records import Record

KEEP = 7 * 24 * 3600.0  # seconds a dispatched row is kept to drop duplicates (NServiceBus's persisters)
TABLE = "kbroker_outbox"


def _encode(records: list[Record]) -> bytes:
    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode()

    return orjson.dumps([[t, b64(k), b64(v), [[n, b64(hv)] for n, hv in (h or [])]] for t, k, v, h in records])


def _decode(data: bytes) -> list[Record]:
    def raw(v: str | None) -> bytes | None:
        return None if v is None else base64.b64decode(v)

    return [(t, raw(k), raw(v), [(n, raw(hv) or b"") for n, hv in h]) for t, k, v, h in orjson.loads(data)]


@dataclass(frozen=True)
class Stored:
    """An incoming message's outbox row: the messages its handling sends, and whether they went."""

    records: list[Record]
    dispatched: bool
    source: str


class Outbox:
    """The outbox table in the application's database (created if missing).

    Parameters
    ----------
    engine: a SQLAlchemy engine of the application's database.
    keep: seconds a dispatched row is kept, so a duplicate of its message is dropped (7 days).
    on_stored: called with a message's Id after the database commit, before the dispatch (for
        metrics; the kill -9 test stops the process there)."""

    def __init__(self, engine: sa.Engine, *, keep: float = KEEP, on_stored: Callable[[str], None] | None = None):
        self.engine = engine
        self.keep = keep
        self.on_stored = on_stored or (lambda mid: None)
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE,
            meta,
            sa.Column("endpoint", sa.String(150), primary_key=True),
            sa.Column("message_id", sa.String(36), primary_key=True),
            sa.Column("stored_at", sa.Float, nullable=False),
            sa.Column("dispatched_at", sa.Float, nullable=True, index=True),
            sa.Column("operations", sa.LargeBinary, nullable=False),
            sa.Column("source", sa.String(400), nullable=False),  # the record it was stored for
        )
        meta.create_all(engine)

    @contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A transaction of the application's database (committed when the block ends)."""
        with self.engine.begin() as conn:
            yield conn

    def get(self, conn: sa.Connection, endpoint: str, message_id: str) -> Stored | None:
        t = self.table
        row = conn.execute(
            sa.select(t.c.operations, t.c.dispatched_at, t.c.source).where(
                t.c.endpoint == endpoint, t.c.message_id == message_id
            )
        ).first()
        return None if row is None else Stored(_decode(row.operations), row.dispatched_at is not None, row.source)

    def store(self, conn: sa.Connection, endpoint: str, message_id: str, records: list[Record], source: str) -> None:
        """The handling's outgoing messages, in the handler's database transaction; `source`:
        the incoming record's place (queue, partition, offset)."""
        conn.execute(
            self.table.insert().values(
                endpoint=endpoint,
                message_id=message_id,
                stored_at=time.time(),
                operations=_encode(records),
                source=source,
            )
        )

    def dispatched(self, endpoint: str, message_id: str) -> None:
        """Mark the row dispatched: its messages went with the incoming message's removal."""
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(
                t.update()
                .where(t.c.endpoint == endpoint, t.c.message_id == message_id)
                .values(dispatched_at=time.time())
            )

    def clean(self, now: float | None = None) -> int:
        """Delete the rows dispatched more than `keep` seconds ago; how many."""
        t = self.table
        cut = (time.time() if now is None else now) - self.keep
        with self.engine.begin() as conn:
            return int(conn.execute(t.delete().where(t.c.dispatched_at < cut)).rowcount or 0)

    def rows(self) -> list[dict[str, Any]]:
        """Every row, for the tests and the curious: endpoint, message_id, stored_at, dispatched_at."""
        t = self.table
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(t.c.endpoint, t.c.message_id, t.c.stored_at, t.c.dispatched_at)).all()
        return [dict(r._mapping) for r in found]
