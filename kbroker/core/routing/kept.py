"""A routing reader's invalid record, kept (pure logic): its dead letter and an event.

Every reader of routing's topics (the dispatcher on inbound, a transmitter on its transmission
topic and on the far acks topic, the views) treats a record it cannot decode, or will not trust,
alike: it skips it, keeps it in the namespace's dead-letter topic with the reason and where it
came from (core/dead_letter.py's kb.dlq.* headers), says so with a ROUTING_RECORD_REFUSED event,
and goes on. Every routing topic's records fit the dead-letter topic (core/topic_limits.py).
"""

from __future__ import annotations

import time

import orjson

from kbroker.core import names
from kbroker.core.dead_letter import ConsumedRecord, dead_letter_record
from kbroker.core.records import Record

ROUTING_RECORD_REFUSED = "ROUTING_RECORD_REFUSED"


def kept(
    namespace: str,
    record: ConsumedRecord,
    reason: str,
    reader: str,
    *,
    sender: str | None = None,
    now_ms: int | None = None,
) -> list[Record]:
    """(the record's dead letter, the event naming it) in `namespace`; `reader` is who refused
    it (dispatcher, transmitter, ...), `sender` the namespace it claimed to come from."""
    event = {
        "event": ROUTING_RECORD_REFUSED,
        "namespace": namespace,
        "reader": reader,
        "topic": record.topic(),
        "partition": record.partition(),
        "offset": record.offset(),
        "claimed_sender": sender,
        "reason": reason,
        "time": now_ms if now_ms is not None else int(time.time() * 1000),
    }
    return [
        dead_letter_record(namespace, record, f"{reader} refused a routing record: {reason}"),
        (names.events_topic(namespace), str(record.topic()).encode(), orjson.dumps(event), None),
    ]
