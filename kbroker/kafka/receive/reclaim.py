"""Reclaiming a namespace's storage, run by the worker that owns the tick on every 5th tick
(also what a test or an operator calls to run it at once):

- `reclaim_namespace`: delete the queue records no reader needs (the rule is core/receive/reclaim.py),
  the transport queues' records their group committed past, and the transmission topic's records
  the far side acknowledged (below the transmitters' commits);
- `reclaim_endpoints`: write the tombstones of endpoints CLOSED for longer than the grace
  period (30 minutes), so compaction removes them and no process reads them again.

Each queue topic and each of its secondary (per-instance) topics is read by the consumer group
of the topic's own name. A partition whose committed offsets are not stable (a transaction that
committed offsets is still open) is left for the next run: its offset is not known yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kbroker.core import names
from kbroker.core.catalog.models import Catalog, Queue
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.conversation_endpoint import (
    CHAIN_SUFFIX,
    CLOSED,
    CLOSED_GRACE_SECONDS,
    DISCONNECTED_OUTBOUND,
    handle_for,
)
from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.dialogs.send_lease import LEASE_SUFFIX, WANT_SUFFIX
from kbroker.core.receive.reclaim import analytics_floor, lowest, reclaim_points
from kbroker.core.transport.bridge import bridge_prefix
from kbroker.core.transport.endpoint import transport_queue_prefix
from kbroker.errors import BrokerUnavailableError, kafka_error
from kbroker.kafka import clients, messages
from kbroker.kafka.dialogs.conversation_endpoints import CLOSED_JSON, read_endpoints
from kbroker.kafka.snapshot import (
    CONSUME_WAIT,
    committed_offsets,
    read_partitions,
    reading_consumer,
    topic_partitions,
)


@dataclass(frozen=True)
class Reclaimed:
    topic: str
    deleted_below: dict[int, int]  # partition -> its new log start


def reclaim_namespace(cluster: ClusterLike, catalog: Catalog, timeout: float = 30.0) -> list[Reclaimed]:
    """Delete, in every queue topic of the catalog's namespace, the records below what the
    topic's readers still need. Returns the topics where records were deleted."""
    admin = clients.admin(cluster)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    done = []
    states: dict[str, str] | None = None  # endpoint states, read once for the RETENTION = ON queues

    def endpoint_states() -> dict[str, str]:
        nonlocal states
        if states is None:
            states = {ep.conversation_handle: ep.state for ep in read_endpoints(cluster, catalog.namespace)}
        return states

    queue_topics = [
        (queue, sorted(t for t in existing if t == topic or t.startswith(topic + ".")))
        for queue in catalog.queues.values()
        for topic in [names.queue_topic(catalog.namespace, queue.name)]
    ]
    partitions = {name: sorted(existing[name].partitions) for _, topics in queue_topics for name in topics}
    unread = analytics_holds(cluster, catalog.namespace, partitions, timeout)
    for queue, topics in queue_topics:
        for name in topics:
            deleted = reclaim_topic(
                cluster,
                admin,
                queue,
                name,
                partitions[name],
                endpoint_states,
                timeout,
                {p: o for (t, p), o in unread.items() if t == name},
            )
            if deleted:
                done.append(Reclaimed(name, deleted))
    tqueues = transport_queue_prefix(catalog.namespace)  # transport queues: read by the group of their name
    for name in sorted(t for t in existing if t.startswith(tqueues)):
        deleted = _reclaim_by_group(cluster, admin, name, sorted(existing[name].partitions), name, timeout)
        if deleted:
            done.append(Reclaimed(name, deleted))
    bridges = bridge_prefix(catalog.namespace)  # bridge topics: pushed below their pushers' commits
    for name in sorted(t for t in existing if t.startswith(bridges)):
        deleted = _reclaim_by_group(cluster, admin, name, sorted(existing[name].partitions), name, timeout)
        if deleted:
            done.append(Reclaimed(name, deleted))
    transmission = names.transmission_topic(catalog.namespace)
    if transmission in existing:  # the 5th tick (docs/sources.md#periodic-tasks): clean acknowledged messages up
        deleted = _reclaim_by_group(
            cluster,
            admin,
            transmission,
            sorted(existing[transmission].partitions),
            names.transmitter_group(catalog.namespace),
            timeout,
        )
        if deleted:
            done.append(Reclaimed(transmission, deleted))
    return done


def _reclaim_by_group(
    cluster: ClusterLike, admin: AdminClient, topic: str, partitions: list[int], group: str, timeout: float
) -> dict[int, int]:
    """Delete a topic's records below the committed offsets of the one group that reads it (the
    transmitters commit each partition up to its oldest unacknowledged message)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    offsets = committed_offsets(cluster, group, tps, timeout)
    points = reclaim_points(
        log_starts(admin, topic, tps, timeout), {tp.partition: tp.offset for tp in offsets if tp.error is None}
    )
    return _delete_below(admin, topic, points, timeout)


def log_starts(admin: AdminClient, topic: str, tps: list[TopicPartition], timeout: float) -> dict[int, int]:
    """Partition -> its log start offset."""
    return {
        tp.partition: clients.result_of(f, f"cannot list the offsets of {topic}").offset
        for tp, f in admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps}, request_timeout=timeout).items()
    }


def _delete_below(admin: AdminClient, topic: str, points: dict[int, int], timeout: float) -> dict[int, int]:
    """Delete each partition's records below its point; partition -> its new log start."""
    if not points:
        return {}
    futures = admin.delete_records(
        [TopicPartition(topic, p, o) for p, o in points.items()], request_timeout=timeout, operation_timeout=timeout
    )
    return {
        tp.partition: clients.result_of(f, f"cannot delete records of {topic}").low_watermark
        for tp, f in futures.items()
    }


def analytics_holds(
    cluster: ClusterLike, namespace: str, topics: dict[str, list[int]], timeout: float
) -> dict[tuple[str, int], int]:
    """(queue topic, partition) -> the offset the analytics job still needs records from, for
    every partition of `topics` (core/receive/reclaim.py analytics_floor); empty when no job runs. One
    read of the job's group for the whole namespace: whether the job runs is a question about
    all its positions, not one topic's."""
    tps = [TopicPartition(t, p) for t, partitions in topics.items() for p in partitions]
    if not tps:
        return {}
    read = committed_offsets(cluster, names.analytics_group(namespace), tps, timeout, stable=False)
    return analytics_floor(
        {(tp.topic, tp.partition): (tp.offset, tp.metadata) if tp.error is None else (-1, None) for tp in read},
        int(time.time() * 1000),
    )


def reclaim_topic(
    cluster: ClusterLike,
    admin: AdminClient,
    queue: Queue,
    topic: str,
    partitions: list[int],
    endpoint_states: Callable[[], dict[str, str]],
    timeout: float,
    unread: dict[int, int] | None = None,
) -> dict[int, int]:
    """Delete one queue topic's records below what its readers need; returns partition -> new start.
    `endpoint_states` (handle -> state) is asked only for a RETENTION = ON queue; `unread`
    (partition -> offset) is what the analytics job has not read yet (analytics_holds)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    starts = log_starts(admin, topic, tps, timeout)
    offsets = committed_offsets(cluster, topic, tps, timeout)  # the group is named as the topic
    # A partition with an error of its own (offsets not stable yet) is not reclaimed this time.
    committed = {tp.partition: tp.offset for tp in offsets if tp.error is None and tp.offset >= 0}
    keep_from = None
    if queue.retention == "ON":
        keep_from = _retained_floor(cluster, topic, starts, committed, endpoint_states(), timeout)
    keep_from = lowest(keep_from, unread)
    return _delete_below(admin, topic, reclaim_points(starts, committed, keep_from), timeout)


def queue_namespace(topic: str) -> str:
    """The namespace of a queue topic (`kbroker.<ns>.queue....`)."""
    return names.namespace_of(topic) or topic.split(".", 2)[1]


def _retained_floor(
    cluster: ClusterLike,
    topic: str,
    starts: dict[int, int],
    committed: dict[int, int],
    endpoints: dict[str, str],
    timeout: float,
) -> dict[int, int]:
    """RETENTION = ON: per partition, the offset of the first received record whose
    conversation this side has not ended (the scan stops there: memory stays one batch)."""

    def live(msg: Message) -> bool:
        try:
            env = Envelope.from_headers(messages.headers(msg))
        except MalformedRecord:
            return False  # not a message: nothing to keep it for
        state = endpoints.get(handle_for(env.conversation_id, env.to_side))
        return state is not None and state not in (DISCONNECTED_OUTBOUND, CLOSED)

    todo = {p: committed[p] for p in starts if p in committed and committed[p] > starts[p]}
    floor = dict(todo)  # nothing live below the commit: the commit is the floor
    if not todo:
        return floor
    consumer = reading_consumer(cluster, names.reader_group(queue_namespace(topic)))
    deadline = time.monotonic() + timeout
    try:
        consumer.incremental_assign([TopicPartition(topic, p, starts[p]) for p in todo])
        while todo and time.monotonic() < deadline:
            for msg in clients.consume_soon(consumer, 500, CONSUME_WAIT):
                err, p = msg.error(), msg.partition()
                if p not in todo:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        del todo[p]
                    continue
                offset = messages.position(msg)[1]
                if offset >= todo[p] or live(msg):
                    floor[p] = min(offset, todo[p])
                    del todo[p]
                    consumer.incremental_unassign([TopicPartition(topic, p)])
    finally:
        consumer.close()
    for p in todo:  # not scanned to the end in time: keep all of it this time
        floor[p] = starts[p]
    return floor


def reclaim_endpoints(
    cluster: ClusterLike,
    namespace: str,
    grace: float = CLOSED_GRACE_SECONDS,
    now: float | None = None,
    timeout: float = 120.0,
) -> int:
    """Tombstone every endpoint whose last record is CLOSED and older than `grace` seconds (and
    its group chain, lease and want, whose keys may live on other partitions, so they are tombstoned
    whether they exist or not). One partition at a time, keeping only the closed ones seen: memory is a
    partition's closed endpoints, not the topic. Returns how many endpoints were reclaimed."""
    before = (time.time() if now is None else now) - grace
    topic = names.endpoints_topic(namespace)
    consumer = reading_consumer(cluster, names.reader_group(namespace))
    producer = clients.idempotent_producer(cluster)
    reclaimed = 0
    closed: set[str] = set()  # handles whose last record so far is CLOSED and old enough, in the partition read

    def note(msg: Message) -> None:
        raw, value = msg.key(), msg.value()
        key = raw.decode(errors="replace") if raw is not None else None
        if key is None or key.endswith((CHAIN_SUFFIX, LEASE_SUFFIX, WANT_SUFFIX)):
            return
        if value is not None and CLOSED_JSON in value and msg.timestamp()[1] / 1000.0 < before:
            closed.add(key)
        else:
            closed.discard(key)

    try:
        for partition in topic_partitions(consumer, topic, timeout) or []:
            closed.clear()
            if read_partitions(consumer, topic, {partition: 0}, timeout, on_record=note).unfinished:
                raise BrokerUnavailableError(f"could not read {topic} [{partition}] to its end in {timeout} s")
            for handle in closed:
                for key in (handle, handle + CHAIN_SUFFIX, handle + LEASE_SUFFIX, handle + WANT_SUFFIX):
                    producer.produce(topic, key=key.encode(), value=None)
                producer.poll(0)
            reclaimed += len(closed)
        if producer.flush(timeout):
            raise BrokerUnavailableError(f"endpoint tombstones of {namespace} not acknowledged in {timeout} s")
    finally:
        consumer.close()
    return reclaimed
