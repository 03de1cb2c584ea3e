"""Reclaiming a namespace's storage, run by the worker that owns the tick on every 5th tick
(also what a test or an operator calls to run it at once):

- `reclaim_namespace`: delete the queue records no reader needs (the rule is core/reclaim.py);
- `reclaim_endpoints`: write the tombstones of endpoints CLOSED for longer than the grace
  period (30 minutes), so compaction removes them and no process reads them again.

Each queue topic and each of its secondary (per-instance) topics is read by the consumer group
of the topic's own name. A partition whose committed offsets are not stable (a transaction that
committed offsets is still open) is left for the next run: its offset is not known yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kbroker.core import names
from kbroker.core.catalog.models import Catalog, Queue
from kbroker.core.endpoint import CHAIN_SUFFIX, CLOSED, CLOSED_GRACE_SECONDS, DISCONNECTED_OUTBOUND, handle_for
from kbroker.core.envelope import Envelope, MalformedRecord
from kbroker.core.reclaim import reclaim_points
from kbroker.errors import BrokerUnavailableError, kafka_error
from kbroker.kafka import clients, messages
from kbroker.kafka.endpoint_store import CLOSED_JSON, EndpointStore
from kbroker.kafka.reader import CONSUME_WAIT, group_offsets, reading_consumer, topic_partitions


@dataclass(frozen=True)
class Reclaimed:
    topic: str
    deleted_below: dict[int, int]  # partition -> its new log start


def reclaim_namespace(bootstrap: str, catalog: Catalog, timeout: float = 30.0) -> list[Reclaimed]:
    """Delete, in every queue topic of the catalog's namespace, the records below what the
    topic's readers still need. Returns the topics where records were deleted."""
    admin = clients.admin(bootstrap)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {bootstrap}", exc.args[0]) from None
    done = []
    for queue in catalog.queues.values():
        topic = names.queue_topic(catalog.namespace, queue.name)
        for name in sorted(t for t in existing if t == topic or t.startswith(topic + ".")):
            partitions = sorted(existing[name].partitions)
            deleted = reclaim_topic(bootstrap, admin, catalog.namespace, queue, name, partitions, timeout)
            if deleted:
                done.append(Reclaimed(name, deleted))
    return done


def reclaim_topic(bootstrap: str, admin: AdminClient, namespace: str, queue: Queue, topic: str,
                  partitions: list[int], timeout: float) -> dict[int, int]:
    """Delete one queue topic's records below what its readers need; returns partition -> new start."""
    tps = [TopicPartition(topic, p) for p in partitions]
    starts = {tp.partition: _result(f, f"cannot list the offsets of {topic}").offset
              for tp, f in admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps},
                                              request_timeout=timeout).items()}
    try:
        offsets = group_offsets(admin, topic, tps, timeout)  # the group is named as the topic
    except KafkaException as exc:
        raise kafka_error(f"cannot list the committed offsets of {topic}", exc.args[0]) from None
    # A partition with an error of its own (offsets not stable yet) is not reclaimed this time.
    committed = {tp.partition: tp.offset for tp in offsets if tp.error is None and tp.offset >= 0}
    keep_from = None
    if queue.retention == "ON":
        keep_from = _retained_floor(bootstrap, namespace, topic, starts, committed, timeout)
    points = reclaim_points(starts, committed, keep_from)
    if not points:
        return {}
    futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in points.items()],
                                   request_timeout=timeout, operation_timeout=timeout)
    deleted = {}
    for tp, future in futures.items():
        deleted[tp.partition] = _result(future, f"cannot delete records of {topic}").low_watermark
    return deleted


def _retained_floor(bootstrap: str, namespace: str, topic: str, starts: dict[int, int],
                    committed: dict[int, int], timeout: float) -> dict[int, int]:
    """RETENTION = ON: per partition, the offset of the first received record whose
    conversation this side has not ended (the scan stops there: memory stays one batch)."""
    store = EndpointStore(bootstrap, namespace, clients.producer(bootstrap), continue_sequences=False)
    try:
        endpoints = {ep.conversation_handle: ep.state for ep in store.all()}
    finally:
        store.close()

    def live(msg) -> bool:
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
    consumer = reading_consumer(bootstrap)
    deadline = time.monotonic() + timeout
    try:
        consumer.incremental_assign([TopicPartition(topic, p, starts[p]) for p in todo])
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(500, CONSUME_WAIT):
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


def reclaim_endpoints(bootstrap: str, namespace: str, grace: float = CLOSED_GRACE_SECONDS,
                      now: float | None = None, timeout: float = 120.0) -> int:
    """Tombstone every endpoint whose last record is CLOSED and older than `grace` seconds (and
    its group chain). One partition at a time, keeping only the closed ones seen: memory is a
    partition's closed endpoints, not the topic. Returns how many endpoints were reclaimed."""
    now = time.time() if now is None else now
    topic = names.endpoints_topic(namespace)
    consumer = reading_consumer(bootstrap)
    producer = clients.idempotent_producer(bootstrap)
    reclaimed = 0
    try:
        for partition in topic_partitions(consumer, topic, timeout) or []:
            closed, chains = _closed_endpoints(consumer, topic, partition, now - grace, timeout)
            for handle in closed:
                for key in (handle, handle + CHAIN_SUFFIX) if handle in chains else (handle,):
                    producer.produce(topic, key=key.encode(), value=None)
                producer.poll(0)
            reclaimed += len(closed)
        if producer.flush(timeout):
            raise BrokerUnavailableError(f"endpoint tombstones of {namespace} not acknowledged in {timeout} s")
    finally:
        consumer.close()
    return reclaimed


def _closed_endpoints(consumer, topic: str, partition: int, before: float,
                      timeout: float) -> tuple[list[str], set[str]]:
    """(handles whose last record in the partition is CLOSED and written before `before`,
    handles with a group chain)."""
    closed: dict[str, float] = {}
    chains: set[str] = set()
    deadline = time.monotonic() + timeout
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    try:
        while True:
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(f"could not read {topic} [{partition}] to its end in {timeout} s")
            batch = consumer.consume(1000, CONSUME_WAIT)
            if any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF for m in batch):
                done = True
            else:
                done = False
            for msg in batch:
                if msg.error() is not None or msg.key() is None:
                    continue
                key = msg.key().decode()
                if key.endswith(CHAIN_SUFFIX):
                    chains.add(key[:-len(CHAIN_SUFFIX)])
                    continue
                value = msg.value()
                if value is not None and CLOSED_JSON in value and msg.timestamp()[1] / 1000.0 < before:
                    closed[key] = msg.timestamp()[1]
                else:
                    closed.pop(key, None)
            if done:
                return list(closed), chains
    finally:
        consumer.unassign()


def _result(future, what: str):
    try:
        return future.result()
    except KafkaException as exc:
        raise kafka_error(what, exc.args[0]) from None
