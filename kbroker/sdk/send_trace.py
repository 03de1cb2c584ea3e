"""Trace contexts: a SEND's record with its own (what Transaction.send and Broker.send both add),
and the span a RECEIVE continues."""

from __future__ import annotations

from typing import Any

from kbroker import tracing
from kbroker.core.dialogs.envelope import Message
from kbroker.core.records import Record
from kbroker.kafka import messages


def traced_record(
    record: Record, namespace: str, queue: str, conversation_id: str, message_type: str, parent: Any
) -> Record:
    """A SEND's record with its trace context in its headers (tracing.py), as it is without tracing."""
    if not tracing.enabled():
        return record
    extra = tracing.send_headers(namespace, queue, conversation_id, message_type, parent)
    topic, key, value, headers = record
    return (topic, key, value, [*(headers or []), *extra]) if extra else record


def receive_trace(namespace: str, queue: str, delivered: list[Message], current: Any) -> Any:
    """The trace context a RECEIVE of `delivered` leaves its transaction (`current` without tracing):
    its SENDs continue it."""
    if not tracing.enabled():
        return current
    parents = [tracing.context_of(messages.headers(m.extra["record"])) for m in delivered]
    return tracing.receive_span(namespace, queue, parents, delivered[0].conversation_id)
