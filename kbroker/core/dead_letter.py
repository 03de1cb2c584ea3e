"""Dead letters, and the record that cannot move even there: set aside, not left in the way.

A record kbroker will not deliver (malformed, refused on arrival, poison) is copied to the
namespace's dead-letter topic with why and where from in kb.dlq.* headers, and its offset is
committed in the same Kafka transaction, so its partition moves on. The topic limits
(core/topic_limits.py) make the dead-letter topic take any record a queue holds, but a topic
configured otherwise (an operator's change, a namespace applied before the limits were made
consistent) can still refuse one. Such a record is set aside: its dead letter goes without the
body (and without the original headers if those alone are too many), with its size, and a
RECORD_SET_ASIDE event on the events topic says so. Either way its offset commits: one record
never holds the records behind it.
"""

from __future__ import annotations

import time
from typing import Protocol

import orjson

from kbroker.core import names
from kbroker.core.records import Header, Record
from kbroker.core.topic_limits import DEAD_LETTER_LIMIT, MAX_REASON_BYTES, record_bytes

RECORD_SET_ASIDE = "RECORD_SET_ASIDE"  # the event of a record whose body no topic would take


class ConsumedRecord(Protocol):
    """A record as a Kafka consumer returns it (confluent_kafka.Message has these methods)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...


def _reason(reason: str) -> bytes:
    """The reason as a header value, cut to MAX_REASON_BYTES (the dead-letter headroom counts on it)."""
    raw = reason.encode()
    return (
        raw if len(raw) <= MAX_REASON_BYTES else raw[: MAX_REASON_BYTES - 3].decode(errors="ignore").encode() + b"..."
    )


def _where(record: ConsumedRecord, reason: str) -> list[Header]:
    return [
        ("kb.dlq.reason", _reason(reason)),
        ("kb.dlq.topic", str(record.topic()).encode()),
        ("kb.dlq.partition", str(record.partition()).encode()),
        ("kb.dlq.offset", str(record.offset()).encode()),
    ]


def dead_letter_record(namespace: str, record: ConsumedRecord, reason: str) -> Record:
    """A malformed record's copy in the namespace's dead-letter topic, with why it was refused
    and where it came from in headers (kb.dlq.*), so it can be inspected and replayed."""
    headers = list(record.headers() or []) + _where(record, reason)
    return (names.deadletter_topic(namespace), record.key(), record.value(), headers)


def set_aside(
    namespace: str, record: ConsumedRecord, reason: str, limit: int = DEAD_LETTER_LIMIT, *, now_ms: int | None = None
) -> tuple[Record, Record]:
    """(the record's dead letter without its body, the RECORD_SET_ASIDE event): for a record
    whose copy the dead-letter topic refuses. The dead letter keeps the key, the
    reason, where the record was and its size (kb.dlq.size, the body's bytes); the original
    headers too, unless with them it is still over `limit`."""
    size = len(record.value() or b"")
    own = _where(record, reason) + [("kb.dlq.size", str(size).encode()), ("kb.dlq.omitted", b"body")]
    headers = list(record.headers() or []) + own
    if record_bytes(record.key(), None, headers) > limit:
        headers = own[:-1] + [("kb.dlq.omitted", b"body,headers")]
    letter: Record = (names.deadletter_topic(namespace), record.key(), None, headers)
    event = {
        "event": RECORD_SET_ASIDE,
        "topic": record.topic(),
        "partition": record.partition(),
        "offset": record.offset(),
        "size": size,
        "reason": _reason(reason).decode(errors="replace"),
        "dead_letter": "without " + headers[-1][1].decode().replace(",", " and "),
        "time": now_ms if now_ms is not None else int(time.time() * 1000),
    }
    return letter, (names.events_topic(namespace), str(record.topic()).encode(), orjson.dumps(event), None)
