"""What a publish writes: one copy of the event to each subscribed endpoint's queue, with one Id
(core/transport/subscriptions.py says who is subscribed to what). TransportTransaction.publish
holds the copies until its commit, so they are written with the transaction's other sends, all
or none."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kbroker.core.records import Record
from kbroker.core.transport.message import ENCLOSED_MESSAGE_TYPES, canonical_id
from kbroker.core.transport.subscriptions import MESSAGE_INTENT, enclosed_types, type_name
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.runtime import TransportRuntime


def event_types(event_type: str | Sequence[str] | None, headers: Mapping[str, str]) -> list[str]:
    """The types an event is published as: `event_type` (a type, or the type then its base types
    and interfaces), else those its `NServiceBus.EnclosedMessageTypes` header names."""
    try:
        if event_type is None:
            if ENCLOSED_MESSAGE_TYPES not in headers:
                raise ValueError(f"name the event's type, or set the {ENCLOSED_MESSAGE_TYPES} header")
            return enclosed_types(headers[ENCLOSED_MESSAGE_TYPES])
        names = [event_type] if isinstance(event_type, str) else list(event_type)
        if not names:
            raise ValueError("name at least one event type")
        return list(dict.fromkeys(type_name(n) for n in names))
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def publish_records(
    rt: TransportRuntime,
    event_type: str | Sequence[str] | None,
    body: bytes | None,
    headers: Mapping[str, str] | None,
    *,
    message_id: str | None,
    **kw: Any,
) -> tuple[list[Record], str, list[str]]:
    """(the copies' records, their Id, the queues they go to) of one publish. The event's types
    go in EnclosedMessageTypes (when the caller did not set it) and MessageIntent is Publish."""
    hs = dict(headers or {})
    types = event_types(event_type, hs)
    if event_type is not None:  # as given (assembly-qualified names stay so), as NServiceBus writes it
        hs.setdefault(ENCLOSED_MESSAGE_TYPES, event_type if isinstance(event_type, str) else ";".join(event_type))
    hs[MESSAGE_INTENT] = "Publish"
    try:
        mid = canonical_id(message_id) if message_id is not None else None
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    records: list[Record] = []
    queues: list[str] = []
    made: dict[int, Record] = {}  # one message per ReplyToAddress shape: the copies differ by topic only
    for sub in rt.subscriptions().subscribers(types):
        shape = sub.queue.count("@")
        if shape in made and shape < 2:  # (a copy for another cluster has its Destination header)
            _t, key, value, wire = made[shape]
            records.append((rt.queues.topic(sub.queue), key, value, wire))
        else:
            record, mid = rt.record(sub.queue, body, hs, message_id=mid, **kw)
            made[shape] = record
            records.append(record)
        queues.append(sub.queue)
    return records, mid or str(uuid.uuid4()), queues  # nobody subscribed: an Id all the same
