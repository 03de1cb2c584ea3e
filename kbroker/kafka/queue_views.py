"""Queue status (ALTER QUEUE ... STATUS) and the views of Service Broker's DMVs that kbroker can
answer: a queue's depth and readers, and sys.conversation_endpoints.

Everything here is read from Kafka when asked (catalog, offsets, consumer group, endpoints topic),
so any process sees the same answer; nothing is cached between calls.
"""

from __future__ import annotations

import struct
import time
from datetime import datetime, timezone
from typing import Any

import orjson
from confluent_kafka import (
    IsolationLevel,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from kbroker.core import names
from kbroker.core.catalog.models import Queue
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.dialogs.retained import NEVER_DELIVERED
from kbroker.core.reader_reports import reader_report
from kbroker.core.receive.offsets import decode_completed
from kbroker.core.rejected import Rejected
from kbroker.errors import CatalogError, InvalidArgumentError, kafka_error
from kbroker.kafka import clients, messages, wire
from kbroker.kafka.catalog.catalog_store import publish_object, read_catalog, write_records
from kbroker.kafka.dialogs.conversation_endpoints import read_endpoints
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import (
    committed_offsets,
    latest_records,
    read_partitions,
    reading_consumer,
    topic_partitions,
)

# Named after Service Broker's BROKER_QUEUE_DISABLED event, which poison handling raises.
QUEUE_DISABLED, QUEUE_ENABLED = "QUEUE_DISABLED", "QUEUE_ENABLED"


def set_queue_status(
    cluster: ClusterLike,
    namespace: str,
    queue: str,
    status: str,
    reason: str,
    *,
    poison: bool = False,
    timeout: float = 30.0,
) -> None:
    """ALTER QUEUE queue WITH STATUS = ON | OFF. Publishes the changed queue to the catalog, then
    puts a QUEUE_DISABLED / QUEUE_ENABLED event (key: the queue) on the namespace's events topic.
    Every process that reads a queue sees the new status within about 0.5 s (its catalog
    watcher); a new Broker reads it at once.
    `poison` marks a queue disabled by poison message handling rather than by an operator."""
    status = status.upper() if isinstance(status, str) else status
    if status not in ("ON", "OFF"):
        raise InvalidArgumentError(f"status must be ON or OFF, not {status!r}")
    q = read_catalog(cluster, namespace, timeout).queue(queue)  # UnknownQueueError
    # Validate rather than model_copy: a frozen model's copy skips validation.
    publish_object(cluster, namespace, "queue", type(q).model_validate({**q.model_dump(), "status": status}), timeout)
    event = {
        "event": QUEUE_DISABLED if status == "OFF" else QUEUE_ENABLED,
        "queue": queue,
        "reason": reason,
        "poison": bool(poison),
        "time": int(time.time() * 1000),
    }
    write_records(cluster, names.events_topic(namespace), {queue: orjson.dumps(event)}, timeout)


def alter_queue_activation(
    cluster: ClusterLike,
    namespace: str,
    queue: str,
    *,
    status: str | None = None,
    max_queue_readers: int | None = None,
    procedure: str | None = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """ALTER QUEUE queue WITH ACTIVATION (STATUS = ON | OFF, MAX_QUEUE_READERS = n, PROCEDURE_NAME = p).
    The worker's monitors see the change on their next tick; turning activation off and on
    recycles the queue's monitor."""
    q = read_catalog(cluster, namespace, timeout).queue(queue)  # UnknownQueueError
    if q.activation is None and procedure is None and status != "OFF":
        raise InvalidArgumentError(f"queue {queue!r} has no activation; give a procedure to add one")
    activation = dict(q.activation.model_dump()) if q.activation is not None else {}
    for key, value in (("status", status), ("max_queue_readers", max_queue_readers), ("procedure", procedure)):
        if value is not None:
            activation[key] = value
    new = type(q).model_validate({**q.model_dump(), "activation": activation})  # validates the values
    _publish_altered(cluster, namespace, new, timeout)
    assert new.activation is not None  # validated from a dict that holds one
    return new.activation.model_dump()


def alter_queue(
    cluster: ClusterLike,
    namespace: str,
    queue: str,
    *,
    retention: str | None = None,
    poison_message_handling: str | None = None,
    drop_activation: bool = False,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """ALTER QUEUE queue WITH RETENTION = ON | OFF, POISON_MESSAGE_HANDLING (STATUS = ON | OFF),
    ACTIVATION (DROP): the queue as published. Every reader and monitor sees it on its next
    read of the catalog; dropping the activation retires the queue's monitor."""
    q = read_catalog(cluster, namespace, timeout).queue(queue)  # UnknownQueueError
    data = q.model_dump()
    for key, value in (("retention", retention), ("poison_message_handling", poison_message_handling)):
        if value is not None:
            data[key] = value
    if drop_activation:
        data["activation"] = None
    new = type(q).model_validate(data)
    _publish_altered(cluster, namespace, new, timeout)
    return new.model_dump(mode="json")


def _publish_altered(cluster: ClusterLike, namespace: str, new: Any, timeout: float) -> None:
    queue = new.name
    publish_object(cluster, namespace, "queue", new, timeout)
    # Tell the monitor at once too: OFF then ON in quick succession must still recycle it.
    from kbroker.core.activation.monitor import MonitorConfig, QueueAltered
    from kbroker.core.activation.monitor_codec import encode

    try:
        write_records(
            cluster,
            names.monitor_events_topic(namespace),
            {queue: encode(QueueAltered(MonitorConfig.from_queue(new)))},
            timeout,
            # The partition the worker's own events for the queue take (aiokafka's murmur2): on
            # another, the event made a second monitor of the queue, owned by another worker.
            partitioner="murmur2_random",
        )
    except CatalogError:
        pass  # no worker has run in this namespace: the first one reads the catalog


def queue_view(cluster: ClusterLike, namespace: str, queue: str, timeout: float = 10.0) -> dict[str, Any]:
    """A queue's status and depth per partition, and its readers (the consumer group).

    Per partition: `end` is the last stable offset (records of open transactions are not ready
    yet), `committed` the queue group's committed offset (None before the first commit: readers
    then start at the log start), `completed_above` the offsets above it that readers already
    completed (from the commit metadata), and `ready` the messages a RECEIVE may still take: read
    and counted (the totals' `ready_exact` true) while the queue holds at most EXACT_READY
    records above its readers' positions, else the upper bound `end - max(committed, start) - completed_above`
    (transaction markers, aborted records, move markers and retained copies take offsets without
    being ready messages). `start` is the log start: records below it were reclaimed
    by the worker once every reader had received them (reclaim.py); `bytes` is what the
    partition's log holds on its leader (None when a broker does not answer DescribeLogDirs)."""
    return queue_view_of(cluster, namespace, read_catalog(cluster, namespace, timeout).queue(queue), timeout)


EXACT_READY = 10_000  # records above the readers' positions a view reads to count what is ready


def ready_counted(
    cluster: ClusterLike, topic: str, spans: dict[int, tuple[int, int, set[int]]], timeout: float
) -> dict[int, int] | None:
    """The ready messages of each partition, counted by reading [base, end) read_committed
    (`spans`: partition -> base, end, offsets completed above base): records that are messages,
    neither completed nor a move marker or retained copy. None when more than EXACT_READY records
    would be read, or the read did not finish in `timeout` (the caller keeps its upper bound)."""
    todo = {p: span for p, span in spans.items() if span[1] > span[0]}
    if sum(end - base - len(done) for base, end, done in todo.values()) > EXACT_READY:
        return None
    counts = dict.fromkeys(spans, 0)
    if not todo:
        return counts
    group = names.reader_group_of(topic)
    if group is None:
        return None

    def count(msg: Message) -> None:
        p, o = messages.position(msg)
        base, end, done = todo[p]
        if o >= end or o in done:
            return
        try:
            env = Envelope.from_headers(messages.raw_headers(msg))
        except MalformedRecord:
            return  # not a message: its reader dead-letters it
        if env.message_type_name not in NEVER_DELIVERED:
            counts[p] += 1

    consumer = reading_consumer(cluster, group)
    try:
        read = read_partitions(consumer, topic, {p: span[0] for p, span in todo.items()}, timeout, count)
    finally:
        consumer.close()
    return None if read.unfinished else counts


def queue_view_of(cluster: ClusterLike, namespace: str, q: Queue, timeout: float = 10.0) -> dict[str, Any]:
    """queue_view of a queue whose catalog entry the caller has read already (one catalog read
    for many queues)."""
    queue = q.name
    topic, group = names.queue_topic(namespace, queue), names.queue_group(namespace, queue)
    admin = clients.admin(cluster)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    meta = metadata.topics.get(topic)
    if meta is None:  # a listing of all leaves out a topic this principal may not DESCRIBE
        consumer = reading_consumer(cluster, group)
        try:
            topic_partitions(consumer, topic, timeout)  # PermissionDeniedError naming the grant
        finally:
            consumer.close()
    if meta is None or meta.error is not None:
        raise CatalogError(f"queue {queue!r} has no topic {topic}: run 'kbroker apply'")
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]

    def offsets(spec: OffsetSpec) -> dict[int, int]:
        futures = admin.list_offsets(
            {tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout
        )
        return {
            tp.partition: clients.result_of(f, f"cannot list the offsets of {topic}").offset
            for tp, f in futures.items()
        }

    starts, ends = offsets(OffsetSpec.earliest()), offsets(OffsetSpec.latest())
    committed = {tp.partition: tp for tp in committed_offsets(cluster, group, tps, timeout, stable=False)}
    desc = clients.result_of(
        admin.describe_consumer_groups([group], request_timeout=timeout)[group],
        f"cannot describe consumer group {group}",
    )

    sizes = _bytes_held(cluster, metadata, topic, timeout)
    partitions = []
    spans: dict[int, tuple[int, int, set[int]]] = {}
    for tp in tps:
        p, start, end = tp.partition, starts[tp.partition], ends[tp.partition]
        c = committed.get(p)
        pos = c.offset if c is not None and c.offset >= 0 else None
        base = max(pos if pos is not None else start, start)  # retention may have passed the commit
        done_above = {o for o in decode_completed(base, c.metadata if c else None) if o < end}
        above = len(done_above)
        spans[p] = (base, end, done_above)
        partitions.append(
            {
                "partition": p,
                "start": start,
                "end": end,
                "committed": pos,
                "completed_above": above,
                "ready": max(0, end - base - above),
                "bytes": sizes.get(p) if sizes is not None else None,
            }
        )
    exact = ready_counted(cluster, topic, spans, timeout)
    if exact is not None:  # the totals say which (ready_exact)
        for tp, row in zip(tps, partitions):
            row["ready"] = exact[tp.partition]
    readers = reader_rows(cluster, namespace, topic, timeout)
    return {
        "queue": q.name,
        "topic": topic,
        "status": q.status,
        "poison_message_handling": q.poison_message_handling,
        "partitions": len(tps),
        "partition_offsets": partitions,
        "totals": {
            **{k: sum(row[k] for row in partitions) for k in ("end", "completed_above", "ready")},
            "ready_exact": exact is not None,
            "bytes": sum(sizes.values()) if sizes is not None else None,
        },
        "group": {"name": group, "state": desc.state.name, "members": len(desc.members)},
        "readers": readers,
        "locked_groups": sum(r["locked_groups"] for r in readers),
        "in_flight": sum(r["in_flight"] for r in readers),
    }


def _bytes_held(cluster: ClusterLike, metadata: Any, topic: str, timeout: float) -> dict[int, int] | None:
    """partition -> bytes its leader holds (DescribeLogDirs, kafka/wire.py); None when a broker
    does not answer it (the view then shows the offsets without the bytes)."""
    by_leader: dict[int, list[int]] = {}
    for p, pm in metadata.topics[topic].partitions.items():
        by_leader.setdefault(pm.leader, []).append(p)
    sizes: dict[int, int] = {}
    try:
        for leader, partitions in by_leader.items():
            node = metadata.brokers[leader]
            held = wire.partition_sizes(cluster, topic, partitions, timeout, node=(node.host, node.port))
            sizes.update({p: n for p, n in held.items() if p in partitions})
    except (OSError, KeyError, ValueError, IndexError, struct.error):
        return None
    return sizes


READER_STALE_SECONDS = 10.0  # a process that has not reported for this long is gone


def reader_rows(cluster: ClusterLike, namespace: str, topic: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The processes reading `topic` now, as they last reported: locked groups, messages in
    flight (taken by open transactions), buffered records, partitions."""
    now, rows = time.time(), []
    rejects = Rejects(cluster, namespace, "queue view", record=False, scanned=True)  # the 5th-tick scan records them
    for msg in (latest_records(cluster, names.readers_topic(namespace), timeout) or {}).values():
        try:
            r = reader_report(msg.value())
        except Rejected as exc:
            rejects.reject(msg, exc.reason)
            continue
        if r.get("topic") == topic and now - r.get("at", 0) <= READER_STALE_SECONDS:
            rows.append(
                {
                    k: r[k]
                    for k in (
                        "process",
                        "partitions",
                        "buffered",
                        "ready_groups",
                        "locked_groups",
                        "in_flight",
                        "paused",
                        "oldest_lock_at",
                    )
                }
                | {"age_s": round(now - r["at"], 1)}
            )
    return sorted(rows, key=lambda r: r["process"])


def conversation_view(cluster: ClusterLike, namespace: str) -> list[dict[str, Any]]:
    """sys.conversation_endpoints: every endpoint in the namespace's endpoints topic, with the
    columns kbroker keeps (the rest of SSB's columns have no meaning here), read from the topic.
    A running worker keeps the same view current in memory (its /conversations/ page)."""
    return conversation_rows(read_endpoints(cluster, namespace, as_written=True))


def conversation_rows(endpoints: list[Endpoint]) -> list[dict[str, Any]]:
    """The rows of sys.conversation_endpoints for `endpoints`."""
    rows = []
    for ep in sorted(endpoints, key=lambda e: (e.conversation_id, not e.is_initiator)):
        rows.append(
            {
                "conversation_handle": ep.conversation_handle,
                "conversation_id": ep.conversation_id,
                "is_initiator": ep.is_initiator,
                "conversation_group_id": ep.conversation_group_id,
                "service_name": ep.service_name,
                "far_service": ep.far_service_name,
                "service_contract_name": ep.service_contract_name,
                "state": ep.state,
                "state_desc": ep.state_desc,
                "priority": ep.priority,
                # As last written: SENDs write the endpoint once per reserved block of sequence
                # numbers (and exactly on a clean close), so a live sender may be up to the bound.
                "send_sequence": ep.send_sequence,
                "sequence_reserved": ep.sequence_reserved,
                # None: the dialog never expires (SSB shows its 2038 default there).
                "lifetime": (
                    datetime.fromtimestamp(ep.lifetime, timezone.utc).isoformat() if ep.lifetime is not None else None
                ),
                # SSB shows 1900-01-01 for "no timer"; kbroker shows null (also once it has fired).
                "dialog_timer": (
                    datetime.fromtimestamp(ep.dialog_timer, timezone.utc).isoformat()
                    if ep.dialog_timer > time.time()
                    else None
                ),
            }
        )
    return rows
