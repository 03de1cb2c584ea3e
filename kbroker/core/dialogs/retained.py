"""RETENTION = ON's sent messages (status 3): a copy of each message a side SENDs, kept in that
side's own queue until this side ends the conversation.

Service Broker keeps every message sent on a conversation of a RETENTION = ON queue in that
queue, beside the received ones. In kbroker a sent message lives in the far side's queue (or
the transmission topic), which reclaims it once received, so SEND writes a copy into the
sender's queue in the same Kafka transaction: the sent record's headers and body, with the
message type RETAINED_MARKER (the real one in H_RETAINED_TYPE), addressed to the sending side
and keyed by its group. The copy is never delivered: RECEIVE consumes it unread (sdk/held.py),
the queue view lists it with status 3 (kafka/receive/retention.py), and the reclaim keeps it
while this side's endpoint lives (kafka/receive/reclaim.py). A record of that type another
client wrote is consumed the same way: it cannot reach a handler.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import Envelope, header_text
from kbroker.core.dialogs.groups import MOVE_MARKER
from kbroker.core.records import Record

RETAINED_MARKER = "urn:kbroker:RetainedSent"  # message type of a retained copy; never delivered
H_RETAINED_TYPE = "kb.retained_message_type"  # the sent message's own type
# The message types of a queue's records that no RECEIVE hands out: a MOVE CONVERSATION's marker
# (groups.py) and a retained copy. Counting a queue's messages leaves them out.
NEVER_DELIVERED = frozenset({MOVE_MARKER, RETAINED_MARKER})


def retained_copy(sent: Record, ep: Endpoint, own_topic: str) -> Record:
    """The copy of `sent` (a message record from side `ep`) for `ep`'s own queue topic."""
    _topic, _key, data, headers = sent
    env = Envelope.from_headers(headers)
    copy = replace(
        env,
        message_type_name=RETAINED_MARKER,
        to_side=ep.side,
        conversation_group_id=ep.conversation_group_id,
        from_broker=None,
        to_broker=None,
    )
    return (own_topic, ep.chain[0], data, [*copy.headers(), (H_RETAINED_TYPE, env.message_type_name.encode())])


def retained_type(headers: Iterable[tuple[str, bytes | str | None]] | None) -> str | None:
    """The sent message's type a retained copy carries; None when absent or not text."""
    for key, value in headers or ():
        if key == H_RETAINED_TYPE and value is not None:
            try:
                return header_text(value) or None
            except UnicodeDecodeError:
                return None
    return None
