"""A queue's messages, as Service Broker's queue view shows them, and RETENTION = ON.

RECEIVE never deletes a record in Kafka: it commits the offset. So the queue view is computed
when asked, from what Kafka already keeps: the queue topic's records (read committed), the queue
consumer group's committed offsets with the completed offsets above them (commit metadata), and
the endpoints topic. A message is `received` (status 0) when its offset is completed, else
`ready` (status 1). RETENTION = OFF lists only ready messages (received ones are gone, as in
Service Broker); RETENTION = ON also lists received ones, and the messages this queue's
services sent (status 3: the copies SEND keeps in the sender's queue, core/dialogs/retained.py).
A conversation this side ended (END CONVERSATION: endpoint DISCONNECTED_OUTBOUND or CLOSED, or
removed WITH CLEANUP) has no messages in the view any more, ready, received or sent, as Service
Broker deletes them.

Bounded by the topic: the view reads the queue topic from its log start, so it costs one pass
over what the topic holds. Kafka never deletes a queue record by age or size; the worker reclaims
the received ones (reclaim.py), and on a RETENTION = ON queue only up to the first record of a
conversation this side has not ended, so the view still lists every received message it must.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.conversation_endpoint import CLOSED, DISCONNECTED_OUTBOUND, Endpoint, handle_for
from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.dialogs.groups import MOVE_MARKER
from kbroker.core.dialogs.retained import RETAINED_MARKER, retained_type
from kbroker.core.receive.offsets import decode_completed
from kbroker.errors import CatalogError
from kbroker.kafka import messages
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.dialogs.conversation_endpoints import read_endpoints
from kbroker.kafka.snapshot import committed_offsets, read_to_end

RECEIVED, READY, SENT = 0, 1, 3  # Service Broker's status column (3: a retained sent message)


@dataclass(frozen=True)
class QueuedRecord:
    partition: int
    offset: int
    timestamp: int
    envelope: Envelope
    body: bytes
    retained_type: str | None = None  # a retained copy's sent message type (retained.py)


def message_rows(
    records: list[QueuedRecord],
    done: Callable[[int, int], bool],
    endpoints: dict[str, Endpoint],
    retention: bool,
    conversation_handle: str | None = None,
) -> list[dict[str, Any]]:
    """The queue view's rows (pure): see the module's docstring for the rules."""
    # A moved conversation's record exists once per hop (see groups.py); the last copy is the
    # message, the earlier ones were consumed by the re-keying.
    latest: dict[tuple[str, bool], QueuedRecord] = {}
    for r in records:
        if r.envelope.message_type_name == MOVE_MARKER:
            continue
        # A sent message and its retained copy share an id (and a topic, when both services
        # use this queue): each is its own row.
        key = (r.envelope.message_id, r.envelope.message_type_name == RETAINED_MARKER)
        seen = latest.get(key)
        if seen is None or r.envelope.hop > seen.envelope.hop:
            latest[key] = r
    rows: list[dict[str, Any]] = []
    for r in sorted(latest.values(), key=lambda r: (r.timestamp, r.partition, r.offset)):
        env = r.envelope
        handle = handle_for(env.conversation_id, env.to_side)
        if conversation_handle is not None and handle != conversation_handle:
            continue
        received = done(r.partition, r.offset)
        ep = endpoints.get(handle)
        if (ep is None and received) or (ep is not None and ep.state in (DISCONNECTED_OUTBOUND, CLOSED)):
            continue  # this side ended the conversation (a target endpoint appears on first receive)
        sent = env.message_type_name == RETAINED_MARKER
        if sent and (not retention or r.retained_type is None):
            continue  # kept while the queue is RETENTION = ON; without its type, not one of ours
        if received and not retention:
            continue
        try:
            body, body_hex = r.body.decode("utf-8"), None
        except UnicodeDecodeError:
            body, body_hex = None, r.body.hex()
        rows.append(
            {
                "status": SENT if sent else RECEIVED if received else READY,
                "priority": env.priority,
                "queuing_order": len(rows),
                # A copy is never re-keyed by MOVE CONVERSATION: its side's group is the endpoint's.
                "conversation_group_id": ep.conversation_group_id if sent and ep else env.conversation_group_id,
                "conversation_handle": handle,
                "message_sequence_number": env.message_sequence_number,
                "service_name": env.from_service_name if sent else env.to_service_name,  # this side's
                "service_contract_name": env.service_contract_name,
                "message_type_name": r.retained_type if sent else env.message_type_name,
                "message_id": env.message_id,
                "message_body": body,
                **({"message_body_hex": body_hex} if body_hex is not None else {}),
                "enqueued_time": r.timestamp,
                "partition": r.partition,
                "offset": r.offset,
            }
        )
    return rows


def queue_messages(
    cluster: ClusterLike, namespace: str, queue: str, conversation_handle: str | None = None, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The messages of `queue` (optionally of one conversation handle) with their status."""
    q = read_catalog(cluster, namespace, timeout).queue(queue)  # UnknownQueueError
    topic, group = names.queue_topic(namespace, queue), names.queue_group(namespace, queue)
    records, partitions = _read_topic(cluster, topic, timeout)
    if not records:
        return []
    done = _completed(cluster, topic, group, partitions, timeout)
    endpoints = {ep.conversation_handle: ep for ep in read_endpoints(cluster, namespace)}
    return message_rows(records, done, endpoints, q.retention == "ON", conversation_handle)


def _read_topic(cluster: ClusterLike, topic: str, timeout: float) -> tuple[list[QueuedRecord], list[int]]:
    """Every committed record of the topic, read from the log start to the end of each partition."""
    records = read_to_end(cluster, topic, timeout, must_finish=True)
    if records is None:
        raise CatalogError(f"queue topic {topic} does not exist: run 'kbroker apply'")
    out = []
    for msg in records:
        try:
            env = Envelope.from_headers(messages.headers(msg))
        except MalformedRecord:
            continue  # not a message: the receivers dead-letter it
        kept = retained_type(messages.headers(msg)) if env.message_type_name == RETAINED_MARKER else None
        out.append(QueuedRecord(*messages.position(msg), msg.timestamp()[1], env, messages.value(msg), kept))
    return out, sorted({messages.partition(m) for m in records})


def _completed(
    cluster: ClusterLike, topic: str, group: str, partitions: list[int], timeout: float
) -> Callable[[int, int], bool]:
    """Whether the queue's readers completed an offset: below the committed offset, or among the
    completed offsets above it that the commit metadata lists."""
    tps = committed_offsets(cluster, group, [TopicPartition(topic, p) for p in partitions], timeout, stable=False)
    committed = {tp.partition: (max(tp.offset, 0), set(decode_completed(max(tp.offset, 0), tp.metadata))) for tp in tps}

    def done(partition: int, offset: int) -> bool:
        base, above = committed.get(partition, (0, set()))
        return offset < base or offset in above

    return done
