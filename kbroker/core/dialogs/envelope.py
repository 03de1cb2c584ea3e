"""A Service Broker message as a Kafka record.

The record key is the receiving side's conversation group id (so one partition owns a group),
the value is the body, and the rest of the message row travels in headers with plain UTF-8
values, so any Kafka client (kcat, kafka-python, the console consumer) can read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from kbroker.core.frozen import built

ENVELOPE_VERSION = "1"
_VERSION_BYTES = ENVELOPE_VERSION.encode()

# Header names. Short, stable, and prefixed so they never clash with an application's headers.
H_VERSION = "kb.v"
H_MESSAGE_ID = "kb.message_id"
H_CONVERSATION_ID = "kb.conversation_id"
H_GROUP_ID = "kb.conversation_group_id"
H_SEQUENCE = "kb.message_sequence_number"
H_MESSAGE_TYPE = "kb.message_type_name"
H_CONTRACT = "kb.service_contract_name"
H_FROM_SERVICE = "kb.from_service_name"
H_TO_SERVICE = "kb.to_service_name"
H_TO_SIDE = "kb.to_side"  # INITIATOR or TARGET: the side that receives this message
H_CORRELATION_ID = "kb.correlation_id"
H_REPLY_TO = "kb.reply_to"
H_EXPIRES = "kb.expires"  # epoch milliseconds; absent means never
H_PRIORITY = "kb.priority"
SYSTEM_SEQUENCE = -1  # messages made by kbroker itself (DialogTimer, lifetime Error, move markers)
H_LIFETIME = "kb.lifetime"  # epoch seconds the dialog expires at; absent means never
# The key the receiver's replies must carry: the sender's original conversation group. The target
# endpoint, created by a dialog's first message, takes its far group from it (RELATED_CONVERSATION).
H_REPLY_GROUP = "kb.reply_conversation_group_id"
H_REPLY_INSTANCE = "kb.reply_instance"  # the sender's secondary queue (NServiceBus callbacks)
H_HOP = "kb.hop"  # how many times a moved conversation's record was re-keyed (see groups.py)
H_REKEYED_FROM = "kb.rekeyed_from"  # "<partition>:<offset>" of the record this one re-keys
# Between namespaces (routing.md): the sending namespace (its broker instance), and the one the
# BEGIN DIALOG named, if any. Present only on messages that went through a transmission topic.
H_FROM_BROKER = "kb.from_broker_instance"
H_TO_BROKER = "kb.to_broker_instance"
# Added by the sending transmitter on the way out (core/dispatch.next_in_line): the sequence number
# of the message before this one on its direction, or -1 when every earlier one was acknowledged.
H_FOLLOWS = "kb.follows"
# Dialog security (core/security/dialog_security.py), within the namespace only (the transmitter
# strips them): "1" on a remote dialog's records begun WITH ENCRYPTION = ON; and the session key
# a secured dialog's first message brought to the target, which its replies are sealed with.
H_ENCRYPTION = "kb.encryption"
H_SESSION = "kb.sec.session"

_REQUIRED = (
    H_MESSAGE_ID,
    H_CONVERSATION_ID,
    H_GROUP_ID,
    H_SEQUENCE,
    H_MESSAGE_TYPE,
    H_CONTRACT,
    H_FROM_SERVICE,
    H_TO_SERVICE,
    H_TO_SIDE,
)
_REQUIRED_SET = frozenset(_REQUIRED)

SIDES = ("INITIATOR", "TARGET")


class MalformedRecord(ValueError):
    """A record on a queue topic that is not a kbroker message; it goes to the dead-letter topic."""


def header_text(value: bytes | str | None) -> str:
    """A header's value as text: a consumed record's come as bytes, None when a header has no
    value, text when another client's library gave it so. UnicodeDecodeError for bytes that are
    not UTF-8 (each decoder names the header)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return value.decode()


@dataclass(frozen=True)
class Envelope:
    """What the sender writes: the message row minus what only the receiver knows."""

    message_id: str
    conversation_id: str
    conversation_group_id: str
    message_sequence_number: int
    message_type_name: str
    service_contract_name: str
    from_service_name: str
    to_service_name: str
    to_side: str
    correlation_id: str | None = None
    reply_to: str | None = None
    expires: int | None = None
    priority: int = 5
    lifetime: int | None = None
    reply_group: str | None = None
    reply_instance: str | None = None
    hop: int = 0
    from_broker: str | None = None
    to_broker: str | None = None
    encryption: bool = False
    session: str | None = None

    def headers(self) -> list[tuple[str, bytes]]:
        # Encoded as built (every SEND builds one): a second pass over the pairs cost as much.
        hs = [
            (H_VERSION, _VERSION_BYTES),
            (H_MESSAGE_ID, self.message_id.encode()),
            (H_CONVERSATION_ID, self.conversation_id.encode()),
            (H_GROUP_ID, self.conversation_group_id.encode()),
            (H_SEQUENCE, str(self.message_sequence_number).encode()),
            (H_MESSAGE_TYPE, self.message_type_name.encode()),
            (H_CONTRACT, self.service_contract_name.encode()),
            (H_FROM_SERVICE, self.from_service_name.encode()),
            (H_TO_SERVICE, self.to_service_name.encode()),
            (H_TO_SIDE, self.to_side.encode()),
            (H_PRIORITY, str(self.priority).encode()),
        ]
        if self.correlation_id is not None:
            hs.append((H_CORRELATION_ID, self.correlation_id.encode()))
        if self.reply_to is not None:
            hs.append((H_REPLY_TO, self.reply_to.encode()))
        if self.expires is not None:
            hs.append((H_EXPIRES, str(self.expires).encode()))
        if self.lifetime is not None:
            hs.append((H_LIFETIME, str(self.lifetime).encode()))
        if self.reply_group is not None:
            hs.append((H_REPLY_GROUP, self.reply_group.encode()))
        if self.reply_instance is not None:
            hs.append((H_REPLY_INSTANCE, self.reply_instance.encode()))
        if self.hop:
            hs.append((H_HOP, str(self.hop).encode()))
        if self.from_broker is not None:
            hs.append((H_FROM_BROKER, self.from_broker.encode()))
        if self.to_broker is not None:
            hs.append((H_TO_BROKER, self.to_broker.encode()))
        if self.encryption:
            hs.append((H_ENCRYPTION, b"1"))
        if self.session is not None:
            hs.append((H_SESSION, self.session.encode()))
        return hs

    @classmethod
    def from_headers(cls, headers: Iterable[tuple[str, bytes | str | None]] | None) -> "Envelope":
        """Decode, or raise MalformedRecord naming what is missing or wrong. Takes a consumed
        record's headers as they come (bytes; text or None from other clients), so the receive
        path decodes each value once."""
        hs: dict[str, str] = {}
        key = ""
        try:
            for key, value in headers or ():
                hs[key] = header_text(value)
        except UnicodeDecodeError:
            raise MalformedRecord(f"header {key!r} is not UTF-8") from None
        if not _REQUIRED_SET <= hs.keys():
            missing = [h for h in _REQUIRED if h not in hs]
            raise MalformedRecord(f"missing header(s) {', '.join(missing)}")
        if hs[H_TO_SIDE] not in SIDES:
            raise MalformedRecord(f"header {H_TO_SIDE} is {hs[H_TO_SIDE]!r}")
        if hs.get(H_VERSION, ENVELOPE_VERSION) != ENVELOPE_VERSION:
            raise MalformedRecord(f"header {H_VERSION} is {hs[H_VERSION]!r}; this kbroker reads {ENVELOPE_VERSION}")
        try:
            seq = int(hs[H_SEQUENCE])
            expires = int(hs[H_EXPIRES]) if H_EXPIRES in hs else None
            priority = int(hs.get(H_PRIORITY, "5"))
            lifetime = int(hs[H_LIFETIME]) if H_LIFETIME in hs else None
            hop = int(hs.get(H_HOP, "0"))
        except ValueError as exc:
            raise MalformedRecord(f"bad number in headers: {exc}") from None
        if seq < SYSTEM_SEQUENCE or hop < 0 or not 1 <= priority <= 10:
            raise MalformedRecord(
                f"out of range in headers: {H_SEQUENCE}={seq}, {H_HOP}={hop}, {H_PRIORITY}={priority} (1-10)"
            )
        return built(
            cls,
            {
                "message_id": hs[H_MESSAGE_ID],
                "conversation_id": hs[H_CONVERSATION_ID],
                "conversation_group_id": hs[H_GROUP_ID],
                "message_sequence_number": seq,
                "message_type_name": hs[H_MESSAGE_TYPE],
                "service_contract_name": hs[H_CONTRACT],
                "from_service_name": hs[H_FROM_SERVICE],
                "to_service_name": hs[H_TO_SERVICE],
                "to_side": hs[H_TO_SIDE],
                "correlation_id": hs.get(H_CORRELATION_ID),
                "reply_to": hs.get(H_REPLY_TO),
                "expires": expires,
                "priority": priority,
                "lifetime": lifetime,
                "reply_group": hs.get(H_REPLY_GROUP),
                "reply_instance": hs.get(H_REPLY_INSTANCE),
                "hop": hop,
                "from_broker": hs.get(H_FROM_BROKER),
                "to_broker": hs.get(H_TO_BROKER),
                "encryption": hs.get(H_ENCRYPTION) == "1",
                "session": hs.get(H_SESSION),
            },
        )


@dataclass(frozen=True)
class Message:
    """One received message: the columns of a Service Broker RECEIVE."""

    queue: str
    conversation_handle: str
    conversation_id: str
    conversation_group_id: str
    message_sequence_number: int
    message_type_name: str
    service_name: str
    service_contract_name: str
    message_id: str
    body: bytes
    priority: int = 5
    correlation_id: str | None = None
    reply_to: str | None = None
    expires: int | None = None
    enqueued_time: int | None = None  # the record's timestamp, epoch ms
    partition: int = -1
    offset: int = -1  # Kafka's counterpart of the message row's RowVersion
    # RECEIVE's `validation` column: E (EMPTY), N (NONE), X (WELL_FORMED_XML or VALID_XML), and
    # J for kbroker's JSON; "" where the message type is not in the catalog.
    validation: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # RECEIVE's `status` column: 0, a received message (the queue view's retention.py statuses).
    status = 0

    @property
    def queuing_order(self) -> int:
        """RECEIVE's `queuing_order`: unique in the queue and rising with each partition's
        order (offset, then partition); a conversation group's messages are in one partition, so
        its messages are in queuing order. Not an order across partitions."""
        return (self.offset << 16) | (self.partition & 0xFFFF)

    @property
    def text(self) -> str:
        """The body as UTF-8 text (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def as_dict(self) -> dict[str, Any]:
        """The columns as a JSON-ready dict: the body as text, or as body_hex when not UTF-8."""
        d = asdict(self)
        d.pop("extra")
        d["status"], d["queuing_order"] = self.status, self.queuing_order
        try:
            d["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            d["body"] = None
            d["body_hex"] = self.body.hex()
        return d


def error_body(code: int, description: str) -> bytes:
    """The body of Service Broker's Error message, so ported code parsing it keeps working."""
    return (
        f'<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>{code}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()
