"""A transport message (NServiceBus's SQL Server transport) as a Kafka record. Pure: no I/O.

The transport's queue is a table (Id, CorrelationId, ReplyToAddress, Recoverable, Expires,
Headers, Body, RowVersion). On Kafka a row is one record of the queue's topic:

    Id              header `Id`, a GUID in its canonical lower-case form; also the record key
    CorrelationId   header `CorrelationId` (absent = NULL), at most 255 characters
    ReplyToAddress  header `ReplyToAddress` (absent = NULL), at most 255 characters
    Recoverable     header `Recoverable`: `true` or `false` (`1` and `0` are read too)
    Expires         header `Expires` (absent = NULL): ISO 8601 UTC, `2026-11-25T10:00:00.000Z`
    Headers         header `Headers`: a JSON object of strings (NServiceBus's header names as-is)
    Body            the record's value (a null value = NULL)
    RowVersion      the record's offset in its partition

Header values are UTF-8, so any Kafka client reads them, and a record a plain producer writes
with these headers is a transport message. Id, Recoverable and Headers are required (NOT NULL in
the table); a record without them, or with a value that does not parse, is malformed.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping

import orjson

from kbroker.core.dialogs.envelope import Envelope, MalformedRecord, header_text
from kbroker.core.frozen import built

H_ID = "Id"
H_CORRELATION_ID = "CorrelationId"
H_REPLY_TO = "ReplyToAddress"
H_RECOVERABLE = "Recoverable"
H_EXPIRES = "Expires"
H_HEADERS = "Headers"
COLUMNS = (H_ID, H_CORRELATION_ID, H_REPLY_TO, H_RECOVERABLE, H_EXPIRES, H_HEADERS)
_REQUIRED = (H_ID, H_RECOVERABLE, H_HEADERS)
MAX_ADDRESS = 255  # varchar(255): CorrelationId and ReplyToAddress
# The message type a transport message stands for in the receiver's buffer (see as_envelope).
TRANSPORT_MESSAGE_TYPE = "kbroker/TransportMessage"

# NServiceBus's own header names, for callers that set them (the transport copies them as-is).
MESSAGE_ID = "NServiceBus.MessageId"
CORRELATION_ID = "NServiceBus.CorrelationId"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
TIME_SENT = "NServiceBus.TimeSent"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"


@dataclass(frozen=True)
class TransportMessage:
    """One row of a transport queue. `row_version`, `partition` and `queue` are known once the
    message is received (the record's offset, partition and queue); `enqueued_ms` is the
    record's timestamp."""

    id: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    correlation_id: str | None = None
    reply_to_address: str | None = None
    recoverable: bool = True
    expires: int | None = None  # epoch milliseconds; None: never
    queue: str | None = None
    partition: int = -1
    row_version: int = -1
    enqueued_ms: int | None = None

    def expired(self, now_ms: int) -> bool:
        return self.expires is not None and self.expires <= now_ms

    def as_dict(self) -> dict[str, Any]:
        """The columns as a JSON-ready dict: the body as text, or as body_hex when not UTF-8."""
        d: dict[str, Any] = {
            "Id": self.id,
            "CorrelationId": self.correlation_id,
            "ReplyToAddress": self.reply_to_address,
            "Recoverable": self.recoverable,
            "Expires": format_expires(self.expires) if self.expires is not None else None,
            "Headers": dict(self.headers),
            "RowVersion": self.row_version,
            "partition": self.partition,
            "queue": self.queue,
        }
        if self.body is None:
            d["Body"] = None
        else:
            try:
                d["Body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                d["Body"], d["body_hex"] = None, self.body.hex()
        return d


def new_message(
    body: bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    now_ms: int,
    message_id: str | None = None,
    correlation_id: str | None = None,
    reply_to_address: str | None = None,
    recoverable: bool = True,
    time_to_be_received: float | None = None,
) -> TransportMessage:
    """A message to send. `time_to_be_received` (seconds) sets Expires; InvalidArgument-style
    problems raise ValueError naming the column."""
    mid = canonical_id(message_id) if message_id is not None else str(uuid.uuid4())
    for name, value in ((H_CORRELATION_ID, correlation_id), (H_REPLY_TO, reply_to_address)):
        if value is not None and (not isinstance(value, str) or len(value) > MAX_ADDRESS):
            raise ValueError(f"{name} must be a string of at most {MAX_ADDRESS} characters")
    if not isinstance(recoverable, bool):
        raise ValueError(f"Recoverable must be True or False, not {recoverable!r}")
    hs = dict(headers or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in hs.items()):
        raise ValueError("Headers must map strings to strings")
    expires = None
    if time_to_be_received is not None:
        if isinstance(time_to_be_received, bool) or not 0 < time_to_be_received < math.inf:
            raise ValueError(f"time_to_be_received must be a positive number of seconds, not {time_to_be_received!r}")
        if now_ms + time_to_be_received * 1000 > MAX_EXPIRES_MS:
            raise ValueError(f"time_to_be_received {time_to_be_received!r} s puts Expires past the year 9999")
        expires = now_ms + int(time_to_be_received * 1000)
    if body is not None and not isinstance(body, bytes):
        raise ValueError("Body must be bytes or None")
    return TransportMessage(mid, body, hs, correlation_id, reply_to_address, recoverable, expires)


_CANONICAL_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_GUID_RE = re.compile(
    r"^(urn:uuid:)?\{?[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}\}?$"
)
MAX_EXPIRES_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: the last time Expires can spell


def canonical_id(value: str) -> str:
    """A GUID in its canonical form (the Id column is a uniqueidentifier); ValueError otherwise.
    Checked as text first: uuid.UUID alone reads '+', '_' and non-ASCII digits as hex digits."""
    text = str(value).strip()
    if _CANONICAL_RE.fullmatch(text):
        return text  # as uuid would write it (every Id kbroker writes): no UUID to build
    if not _GUID_RE.match(text):
        raise ValueError(f"Id {value!r} is not a GUID")
    return str(uuid.UUID(text))


def format_expires(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    """ISO 8601 to an aware datetime; a time without an offset is UTC, as the table's datetime is."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def parse_expires(text: str) -> int:
    """ISO 8601 to epoch ms (see parse_iso)."""
    return int(round(parse_iso(text).timestamp() * 1000))


def to_headers(msg: TransportMessage) -> list[tuple[str, bytes]]:
    """The record headers of a message: one per column (NULL columns left out)."""
    hs = [
        (H_ID, msg.id.encode()),
        (H_RECOVERABLE, b"true" if msg.recoverable else b"false"),
        (H_HEADERS, orjson.dumps(dict(msg.headers))),
    ]
    if msg.correlation_id is not None:
        hs.append((H_CORRELATION_ID, msg.correlation_id.encode()))
    if msg.reply_to_address is not None:
        hs.append((H_REPLY_TO, msg.reply_to_address.encode()))
    if msg.expires is not None:
        hs.append((H_EXPIRES, format_expires(msg.expires).encode()))
    return hs


def from_record(
    headers: Iterable[tuple[str, bytes | str | None]] | None,
    value: bytes | None,
    *,
    queue: str | None = None,
    partition: int = -1,
    offset: int = -1,
    timestamp_ms: int | None = None,
) -> TransportMessage:
    """Decode a record, or raise MalformedRecord naming the column that is missing or wrong.
    Headers other than the columns are ignored (a plain producer may add its own)."""
    cols: dict[str, str] = {}
    for key, raw in headers or ():
        if key not in COLUMNS:
            continue
        if key in cols:
            raise MalformedRecord(f"column header {key!r} appears twice")
        try:
            cols[key] = header_text(raw)
        except UnicodeDecodeError:
            raise MalformedRecord(f"column header {key!r} is not UTF-8") from None
    missing = [c for c in _REQUIRED if c not in cols]
    if missing:
        raise MalformedRecord(f"not a transport message: missing column header(s) {', '.join(missing)}")
    try:
        mid = canonical_id(cols[H_ID])
    except ValueError as exc:
        raise MalformedRecord(str(exc)) from None
    recoverable = {"true": True, "1": True, "false": False, "0": False}.get(cols[H_RECOVERABLE].strip().lower())
    if recoverable is None:
        raise MalformedRecord(f"Recoverable is {cols[H_RECOVERABLE]!r}, not true or false")
    try:
        hs = orjson.loads(cols[H_HEADERS])
    except orjson.JSONDecodeError:
        raise MalformedRecord("Headers is not JSON") from None
    if not isinstance(hs, dict) or not all(isinstance(v, str) for v in hs.values()):
        raise MalformedRecord("Headers is not a JSON object of strings")
    for name in (H_CORRELATION_ID, H_REPLY_TO):
        if len(cols.get(name, "")) > MAX_ADDRESS:
            raise MalformedRecord(f"{name} is longer than {MAX_ADDRESS} characters")
    expires = None
    if H_EXPIRES in cols:
        try:
            expires = parse_expires(cols[H_EXPIRES])
            format_expires(expires)  # a time it cannot write again (before the year 1 in UTC) is refused now
        except (ValueError, OverflowError, OSError):
            raise MalformedRecord(f"Expires {cols[H_EXPIRES]!r} is not an ISO 8601 time of the years 1-9999") from None
    return TransportMessage(
        mid,
        value,
        hs,
        cols.get(H_CORRELATION_ID),
        cols.get(H_REPLY_TO),
        recoverable,
        expires,
        queue,
        partition,
        offset,
        timestamp_ms,
    )


@dataclass(frozen=True)
class TransportEnvelope(Envelope):
    """The envelope a transport queue's receiver buffers: what the buffer orders and groups
    by, and the message decoded once, on the poll thread."""

    message: TransportMessage = field(kw_only=True)


def as_envelope(msg: TransportMessage, queue: str) -> TransportEnvelope:
    """What the receiver's per-group buffer needs of a transport message: each message is a
    group of its own (keyed by Id), so any reader may take any message, oldest first, and
    Expires is honoured by the buffer as it is for Service Broker messages. Made once per
    message received, so filled without the frozen __init__ (frozen.built: every field given)."""
    return built(
        TransportEnvelope,
        {
            "message": msg,
            "message_id": msg.id,
            "conversation_id": msg.id,
            "conversation_group_id": msg.id,
            "message_sequence_number": 0,
            "message_type_name": TRANSPORT_MESSAGE_TYPE,
            "service_contract_name": "",
            "from_service_name": "",
            "to_service_name": queue,
            "to_side": "TARGET",
            "correlation_id": msg.correlation_id,
            "reply_to": msg.reply_to_address,
            "expires": msg.expires,
            "priority": 5,
            "lifetime": None,
            "reply_group": None,
            "reply_instance": None,
            "hop": 0,
            "from_broker": None,
            "to_broker": None,
            "encryption": False,
            "session": None,
        },
    )


def with_position(
    msg: TransportMessage, queue: str, partition: int, offset: int, timestamp_ms: int | None
) -> TransportMessage:
    # Headers of its own: what a handler changes is not seen by a retry or by on_error.
    return replace(
        msg, headers=dict(msg.headers), queue=queue, partition=partition, row_version=offset, enqueued_ms=timestamp_ms
    )
