"""A SEND's record with its trace context: what Transaction.send and Broker.send both add."""

from __future__ import annotations

from typing import Any

from kbroker import tracing
from kbroker.core.records import Record


def traced_record(
    record: Record, namespace: str, queue: str, conversation_id: str, message_type: str, parent: Any
) -> Record:
    """A SEND's record with its trace context in its headers (tracing.py), as it is without tracing."""
    if not tracing.enabled():
        return record
    extra = tracing.send_headers(namespace, queue, conversation_id, message_type, parent)
    topic, key, value, headers = record
    return (topic, key, value, [*(headers or []), *extra]) if extra else record
