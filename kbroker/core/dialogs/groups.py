"""Conversation groups: RELATED_CONVERSATION(_GROUP) and MOVE CONVERSATION, as pure functions.

A queue record's key is the receiving side's group. The far side learns that key once, from the
dialog's first message (header kb.reply_conversation_group_id; absent: the dialog id), so a dialog
begun in a related group gets its replies keyed by that group from the start.

MOVE CONVERSATION does not tell the far side. It appends the new group to this side's endpoint
(`group_chain`: the key the far side sends with, then each group moved to) and puts a marker
record, keyed by the group being left, on this side's queue. A record that reaches chain[i]
(hop i) and is not at the end of the chain is not delivered: the receiver re-produces it keyed by
chain[i+1] (hop i+1) and commits its offset in one Kafka transaction, while holding the group
lock of chain[i]. Every group of the chain thus receives the conversation's records from exactly
one stream, in order, so message_sequence_number order survives the move without any reader
having to wait for or reorder sequence numbers; and the records are only ever deliverable in one
group, so two readers never hold them at once. The marker sits in the old group's stream right
where the move committed: a process that receives it learns of the move even if it cached the
endpoint before. The chain is also written under its own key in the endpoints topic (see
EndpointStore), so an endpoint written later from a cache that predates the move cannot undo it.
Telling the far side instead would let its later records (new key, another partition) overtake
older ones still being re-keyed, and ordering them would need a receive sequence written to the
endpoint topic by every RECEIVE. The price of this choice: each of the
far side's later messages makes one extra hop per move.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from kbroker.core.dialogs.conversation_endpoint import STARTED_OUTBOUND, Endpoint
from kbroker.core.dialogs.envelope import H_GROUP_ID, H_HOP, H_REKEYED_FROM

MOVE_MARKER = "urn:kbroker:MoveConversation"  # message type of the marker; never delivered


def parse_group(value: object) -> str:
    """A conversation group id is a GUID, written in its canonical form."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"conversation group {value!r} is not a GUID") from None


def moved(ep: Endpoint, group: str) -> tuple[Endpoint, bool]:
    """This side's endpoint after MOVE CONVERSATION to `group`, and whether records may already
    be on their way under the old key (then a marker must go to the old group)."""
    if group == ep.conversation_group_id:
        return ep, False
    if ep.state == STARTED_OUTBOUND:
        # Nothing sent yet, so the far side has not been told a key: the first message tells it
        # the new group directly.
        return replace(ep, conversation_group_id=group, group_chain=()), False
    return replace(ep, conversation_group_id=group, group_chain=ep.chain + (group,)), True


def next_hop(ep: Endpoint | None, hop: int) -> str | None:
    """The group a record at position `hop` of the chain must be re-keyed to, or None to deliver."""
    if ep is None:
        return None
    chain = ep.chain
    return chain[hop + 1] if hop + 1 < len(chain) else None


Headers = list[tuple[str, bytes]]


def rekeyed_headers(headers: Headers, group: str, hop: int, origin: str) -> Headers:
    """The record's headers with its new group and hop, and where it came from."""
    kept = [(k, v) for k, v in headers if k not in (H_GROUP_ID, H_HOP, H_REKEYED_FROM)]
    return kept + [(H_GROUP_ID, group.encode()), (H_HOP, str(hop).encode()), (H_REKEYED_FROM, origin.encode())]
