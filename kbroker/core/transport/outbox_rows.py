"""An outbox row's contents and the rules for what it dispatches (pure: the SQL is in
sdk/transport/outbox.py and sdk/transport/aio_outbox.py).

A row holds the sends of one incoming message's handling, encoded as JSON (bytes as base64),
and the place of the record it was stored for, so a duplicate read while that record is
between its database commit and its dispatch is told apart from that record back after a crash.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from kbroker.core.records import Record

KEEP = 7 * 24 * 3600.0  # seconds a dispatched row is kept to drop duplicates (NServiceBus's persisters)


def encode(records: list[Record]) -> bytes:
    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode()

    return orjson.dumps([[t, b64(k), b64(v), [[n, b64(hv)] for n, hv in (h or [])]] for t, k, v, h in records])


def decode(data: bytes) -> list[Record]:
    def raw(v: str | None) -> bytes | None:
        return None if v is None else base64.b64decode(v)

    return [(t, raw(k), raw(v), [(n, raw(hv) or b"") for n, hv in h]) for t, k, v, h in orjson.loads(data)]


@dataclass(frozen=True)
class Stored:
    """An incoming message's outbox row: the messages its handling sends, and whether they went."""

    records: list[Record]
    dispatched: bool
    source: str


def source_of(queue: str | None, partition: int, row_version: int) -> str:
    """The place of the incoming record an outbox row is stored for."""
    return f"{queue}:{partition}:{row_version}"


def to_dispatch(
    stored: Stored | None, fresh: list[Record], source: str, count: Callable[[str], None]
) -> tuple[list[Record], bool]:
    """What the removal's Kafka transaction carries, and whether the row is then marked
    dispatched: the handling's own sends (`fresh`, no row before); none for a duplicate
    (another copy was handled, and is dispatched or will be); a row this record stored before a
    crash: its sends, now, once."""
    if stored is None:
        return fresh, True
    if stored.dispatched or stored.source != source:
        count("duplicates_dropped")
        return [], False
    count("outbox_recovered")
    return stored.records, True
