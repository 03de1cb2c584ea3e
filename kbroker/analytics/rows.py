"""The analytics job's rows (docs/analytics.md): what the query projects of each record it reads,
how a micro-batch's rows reach the driver (Arrow, column by column), and how they become the pure
state's inputs (core/analytics/queue_analytics.py) and the positions the results record."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from kbroker.core import names
from kbroker.core.analytics.analytics_model import Arrival
from kbroker.core.analytics.analytics_records import armed_timer, progress_snapshot
from kbroker.core.analytics.queue_analytics import Analytics
from kbroker.core.dialogs.envelope import (
    H_CONVERSATION_ID,
    H_GROUP_ID,
    H_MESSAGE_ID,
    H_MESSAGE_TYPE,
    H_REKEYED_FROM,
    H_TO_SIDE,
)
from kbroker.core.rejected import Rejected, text_key

__all__ = ["FIELDS", "PROJECTION", "TEXT", "Record", "apply_rows", "collect", "read_positions"]


def _header(name: str) -> str:
    return f"try_element_at(hs, '{name}')"  # bytes: decoded by collect() (see TEXT)


# One row per record: what the pure state needs and nothing more (a queue record's body stays
# in Kafka). Sorted by the driver into one order that a batch run again repeats.
PROJECTION = [
    "topic",
    "partition",
    "offset",
    "CAST(unix_millis(timestamp) AS LONG) AS ts",
    "key",
    "CASE WHEN topic LIKE '%.queue.%' THEN NULL ELSE value END AS value",
    f"{_header(H_MESSAGE_ID)} AS message_id",
    f"{_header(H_CONVERSATION_ID)} AS conversation_id",
    f"{_header(H_TO_SIDE)} AS side",
    f"{_header(H_GROUP_ID)} AS grp",
    f"{_header(H_MESSAGE_TYPE)} AS message_type",
    f"{_header(H_REKEYED_FROM)} AS rekeyed_from",
    f"{_header('kb.dlq.topic')} AS dlq_topic",
]


FIELDS = (
    "topic",
    "partition",
    "offset",
    "ts",
    "key",
    "value",
    "message_id",
    "conversation_id",
    "side",
    "grp",
    "message_type",
    "rekeyed_from",
    "dlq_topic",
)
Record = namedtuple("Record", FIELDS)  # type: ignore[misc]


# The columns read as text. Spark's CAST to STRING does not check UTF-8 and Arrow then refuses
# the batch: one record's key or header that another client wrote as other bytes failed the query,
# and every restart from its checkpoint failed on the same batch. Decoded here, with
# replacement characters; the key and value stay bytes for the decoders (core/analytics/analytics_records.py).
TEXT = frozenset(FIELDS) - {"topic", "partition", "offset", "ts", "key", "value"}


def _text(values: list[bytes | None]) -> list[str | None]:
    return [None if v is None else v.decode(errors="replace") for v in values]


def collect(frame: Any) -> list[Any]:
    """The batch's projected rows on the driver, through Arrow (column by column: a plain
    collect() of 20,000 rows built Row objects for seconds)."""
    table = frame.toArrow()
    columns = [
        _text(table.column(name).to_pylist()) if name in TEXT else table.column(name).to_pylist() for name in FIELDS
    ]
    return [Record._make(values) for values in zip(*columns)]


def apply_rows(state: Analytics, namespace: str, rows: list[Any]) -> list[tuple[Any, str]]:
    """Feed one batch's projected rows to the state, in (timestamp, topic, partition, offset) order
    (a snapshot meets the records of its time). Within a partition that order may not be the offsets'
    (several producers SEND to it): the state knows a record by its offset, so it counts each once.
    Returns the progress rows that are not snapshots, with why (skipped: the job records them). A
    timers record that is not a timer is skipped too; the timer service records it."""
    progress_topic, timers_topic = names.progress_topic(namespace), names.timers_topic(namespace)
    deadletter_topic = names.deadletter_topic(namespace)
    rejected: list[tuple[Any, str]] = []
    for r in sorted(rows, key=lambda r: (r.ts, r.topic, r.partition, r.offset)):
        if r.topic == progress_topic:
            try:
                state.progress(progress_snapshot(r.value))
            except Rejected as exc:
                rejected.append((r, exc.reason))
        elif r.topic == timers_topic:
            try:
                state.timer(text_key(r.key), None if r.value is None else armed_timer(namespace, r.value))
            except Rejected:
                continue
        elif r.topic == deadletter_topic:
            queue = names.queue_of_topic(namespace, r.dlq_topic or "")
            if queue is not None and r.conversation_id and r.side:
                state.dead_lettered(queue, r.conversation_id, r.side, r.ts)
        else:
            queue = names.queue_of_topic(namespace, r.topic)
            if queue is None or not (r.message_id and r.conversation_id and r.side and r.message_type):
                continue  # not a kbroker message: the readers dead-letter it
            state.arrival(
                Arrival(
                    queue,
                    r.partition,
                    r.offset,
                    r.ts,
                    r.message_id,
                    r.conversation_id,
                    r.side,
                    r.grp or "",
                    r.message_type,
                    r.rekeyed_from,
                )
            )
    return rejected


def read_positions(
    rows: list[Any], namespace: str, before: dict[str, dict[str, int]] | None = None
) -> dict[tuple[str, int], int]:
    """(queue topic, partition) -> the offset the job has read up to: after the last record of it
    in the batch, or where the previous batch ended (so a partition with nothing new says so too)."""
    head = names.prefix(namespace) + "queue."
    out: dict[tuple[str, int], int] = {}
    for topic, partitions in (before or {}).items():
        if topic.startswith(head):
            for partition, offset in partitions.items():
                if int(offset) >= 0:
                    out[(topic, int(partition))] = int(offset)
    for r in rows:
        if r.topic.startswith(head):
            key = (r.topic, r.partition)
            out[key] = max(out.get(key, 0), r.offset + 1)
    return out
