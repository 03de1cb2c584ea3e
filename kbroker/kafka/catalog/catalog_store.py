"""The catalog topic: a compacted topic with one record per object, key "<kind>/<name>", value the
object as JSON (a null value deletes it). Every process rebuilds its Catalog by reading the topic
from the beginning to the end offsets it saw when it started reading."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException
from pydantic import BaseModel, ValidationError

from kbroker.core import names
from kbroker.core.catalog.catalog_records import KINDS, catalog_record
from kbroker.core.catalog.loader import pydantic_reason
from kbroker.core.catalog.models import (
    BUILTIN_CONTRACTS,
    BUILTIN_MESSAGE_TYPES,
    Catalog,
)
from kbroker.core.catalog.objects import published_key
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.rejected import Rejected
from kbroker.errors import BrokerUnavailableError, CatalogError, InvalidArgumentError, KBrokerError, kafka_error
from kbroker.kafka import clients, producer_failures
from kbroker.kafka.background import Background
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions, watermarks
from kbroker.kafka.topic_propagation import partitions_after_propagation

__all__ = [
    "FIELDS",
    "CatalogWatcher",
    "kafka_error",
    "publish",
    "publish_object",
    "read_catalog",
    "records",
    "write_records",
]

log = logging.getLogger("kbroker.catalog")

# record kind -> Catalog field
FIELDS = {kind: field for kind, (field, _) in KINDS.items()}


def records(catalog: Catalog) -> dict[str, bytes]:
    """key -> JSON value of every object the catalog topic holds (built-ins are implicit)."""
    builtin: dict[str, dict[str, Any]] = {"message_types": BUILTIN_MESSAGE_TYPES, "contracts": BUILTIN_CONTRACTS}
    out: dict[str, bytes] = {}
    for kind, field in FIELDS.items():
        for name, obj in getattr(catalog, field).items():
            if builtin.get(field, {}).get(name) != obj:
                out[f"{kind}/{name}"] = orjson.dumps(obj.model_dump(mode="json"))
    return out


def publish(cluster: ClusterLike, catalog: Catalog, previous: Catalog | None = None, timeout: float = 30.0) -> int:
    """Write the catalog's objects to its topic; with `previous`, only those that changed.
    Returns how many records were written. The topic must exist (see apply.ensure_system_topics)."""
    old = records(previous) if previous is not None else {}
    todo = {k: v for k, v in records(catalog).items() if old.get(k) != v}
    write_records(cluster, names.catalog_topic(catalog.namespace), todo, timeout)
    return len(todo)


def publish_object(cluster: ClusterLike, namespace: str, kind: str, obj: BaseModel, timeout: float = 30.0) -> None:
    """Write one catalog object (e.g. ALTER QUEUE's changed queue); every reader sees it on its
    next read of the catalog."""
    if kind not in FIELDS:
        raise InvalidArgumentError(f"unknown catalog kind {kind!r} (one of {', '.join(FIELDS)})")
    data = obj.model_dump(mode="json")
    name: str = data["name"]  # every catalog object is named
    value = orjson.dumps(data)
    write_records(cluster, names.catalog_topic(namespace), {f"{kind}/{name}": value}, timeout)


def _collect_errors(errors: list[KafkaError]) -> Callable[[KafkaError | None, object], None]:
    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    return on_delivery


def write_records(
    cluster: ClusterLike, topic: str, todo: Mapping[str, bytes | None], timeout: float, partitioner: str | None = None
) -> None:
    """Produce key -> value records (None: a tombstone, DROP) to an existing kbroker topic;
    returns once all are acknowledged. `partitioner`: librdkafka's, where the topic's readers
    expect another client's choice of partition (murmur2_random: the Java and aiokafka one)."""
    producer = clients.producer(
        cluster,
        **({"partitioner": partitioner} if partitioner else {}),
        **{
            "enable.idempotence": True,  # retries never duplicate or reorder catalog records
            "allow.auto.create.topics": False,  # an auto-created topic would not be compacted
            "message.timeout.ms": int(timeout * 1000),
            "error_cb": (fatal := producer_failures.FatalError()),
        },
    )
    if partitions_after_propagation(producer, topic, timeout, never_creates=True) is None:
        raise CatalogError(f"topic {topic} does not exist: run 'kbroker apply' first")
    errors: list[KafkaError] = []
    try:
        for key, value in todo.items():
            producer.produce(topic, key=key.encode(), value=value, on_delivery=_collect_errors(errors))
            producer.poll(0)
        remaining = clients.flush(producer, timeout)
    except KafkaException as exc:  # the producer failed for good: its fatal error says why
        raise producer_failures.producer_failed(
            cluster, fatal.of(producer, exc.args[0]), topic, f"publishing to {topic} failed"
        ) from None
    if errors:
        raise clients.denied(cluster, errors[0], f"publishing to {topic} failed", topic=("WRITE", topic))
    if remaining:
        raise BrokerUnavailableError(f"publishing to {topic}: {remaining} records not acknowledged in {timeout}s")


def read_catalog(
    cluster: ClusterLike,
    namespace: str,
    timeout: float = 10.0,
    *,
    last_bad: dict[bytes | None, tuple[Any, str]] | None = None,
) -> Catalog:
    """The namespace's catalog as published; only the built-ins when the topic does not exist.
    `last_bad`: see read_catalog_with."""
    topic = names.catalog_topic(namespace)
    consumer = reading_consumer(cluster, names.reader_group(namespace), **{"allow.auto.create.topics": False})
    try:
        partitions = topic_partitions(consumer, topic, timeout)
        if partitions is None:
            return Catalog(namespace=namespace)
        return read_catalog_with(
            consumer,
            namespace,
            partitions,
            timeout,
            Rejects(cluster, namespace, "catalog reader", record=False, scanned=True),
            last_bad=last_bad,
        )
    finally:
        consumer.close()


def read_catalog_with(
    consumer: Consumer,
    namespace: str,
    partitions: list[int],
    timeout: float,
    rejects: Rejects,
    *,
    last_bad: dict[bytes | None, tuple[Any, str]] | None = None,
) -> Catalog:
    """The catalog read with a consumer the caller keeps (the watcher's: creating a consumer for
    every change is what a loaded machine is slowest at). A record that is not a catalog object
    (anyone who may write the topic may write anything) is skipped, the key keeping its last
    valid object, and handed to `rejects`; the worker's 5th-tick scan records it and says so, once
    (kafka/rejects.py), so this process's readers note it at DEBUG only (`scanned`): each read of
    the topic whole meets it again, a tombstoned one until compaction removes it.
    With `last_bad` (the catalog's writer, apply, which repairs): filled with key -> (record,
    reason) of each key whose last record is bad, and those keys' objects are left out, so the
    writer publishes them again."""
    topic = names.catalog_topic(namespace)
    read = read_partitions(consumer, topic, dict.fromkeys(partitions, 0), timeout)
    if read.unfinished:
        raise BrokerUnavailableError(f"reading {topic} did not reach its end within {timeout}s")
    fields: dict[str, dict[str, Any]] = {field: {} for field in FIELDS.values()}
    bad: dict[bytes | None, tuple[Any, str]] = {}
    for msg in read.records:  # a key's records are in one partition, in offset order
        try:
            decoded = catalog_record(msg.key(), msg.value())
        except Rejected as exc:
            rejects.reject(msg, exc.reason)
            bad[msg.key()] = (msg, exc.reason)
            continue
        bad.pop(msg.key(), None)
        if decoded is not None:  # None: a kind written by a newer kbroker
            field, name, obj = decoded
            if obj is None:
                fields[field].pop(name, None)
            else:
                fields[field][name] = obj  # later records replace earlier ones
    if last_bad is not None:
        last_bad.update(bad)
        for key in bad:
            kind, _, name = (key or b"").decode(errors="replace").partition("/")
            fields.get(FIELDS.get(kind, ""), {}).pop(name, None)
    fields["queues"] = {name: published_key(q) for name, q in fields["queues"].items()}
    try:
        return Catalog.model_validate({"namespace": namespace, **fields})
    except ValidationError as exc:  # each object was valid on its own: not expected
        reason = pydantic_reason(exc)
        raise CatalogError(f"the catalog topic of {namespace!r} holds an invalid object: {reason}") from None


class CatalogWatcher(Background):
    """Keeps a process's catalog current: every `interval` seconds it asks where the catalog
    topic ends, and reads the catalog again when that moved, handing it to `on_change`. An ALTER
    QUEUE from any process (STATUS = OFF, by a user or the poison rule) thus reaches every
    process within about `interval`, not on its next catalog error. The first look reads the
    catalog too. A broker outage is logged once (the Kafka logger's limiter) and the watch goes
    on."""

    thread_name = "kbroker-catalog-watch"

    def __init__(
        self, cluster: ClusterLike, namespace: str, on_change: Callable[[Catalog], None], interval: float = 0.5
    ):
        super().__init__()
        self._cluster, self._namespace, self._on_change = Cluster.of(cluster), namespace, on_change
        self._interval = interval
        self._end: tuple[int, ...] | None = None  # where the topic ended at the last look
        # A bad record is noted at DEBUG: the 5th-tick scan reports and records it (kafka/rejects.py).
        self._rejects = Rejects(self._cluster, namespace, "catalog watcher", record=False, scanned=True)

    def _run(self) -> None:
        topic = names.catalog_topic(self._namespace)
        consumer = reading_consumer(
            self._cluster, names.reader_group(self._namespace), **{"allow.auto.create.topics": False}
        )
        failing = False
        partitions: list[int] | None = None  # the catalog topic's, asked until it exists
        try:
            while not self._stop.wait(self._interval):
                try:
                    if partitions is None:
                        partitions = topic_partitions(consumer, topic, 5.0)
                    # watermarks() follows a leader that moved: this consumer fetches only to read.
                    asked = time.monotonic() + 5.0
                    end = tuple(watermarks(consumer, topic, p, asked)[1] for p in partitions or ())
                    # The first look reads the catalog too: it may have changed between the
                    # process's own read and this watcher's start (a queue disabled then was
                    # missed until the next change).
                    if self._end is None or end != self._end:
                        self._on_change(
                            read_catalog_with(consumer, self._namespace, partitions or [], 10.0, self._rejects)
                        )
                    self._end, failing = end, False
                except (KafkaException, KBrokerError) as exc:
                    if not failing:
                        log.warning("catalog watch of %s paused: %s", topic, exc)
                    failing = True
        finally:
            consumer.close()
