"""The catalog topic: a compacted topic with one record per object, key "<kind>/<name>", value the
object as JSON (a null value deletes it). Every process rebuilds its Catalog by reading the topic
from the beginning to the end offsets it saw when it started reading."""

from __future__ import annotations

import time

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from pydantic import BaseModel, ValidationError

from kbroker.config import KAFKA_LOG
from kbroker.core import names
from kbroker.core.catalog.loader import pydantic_reason
from kbroker.core.catalog.models import (
    BUILTIN_CONTRACTS,
    BUILTIN_MESSAGE_TYPES,
    Catalog,
)
from kbroker.errors import BrokerUnavailableError, CatalogError, kafka_error

# record kind -> Catalog field
FIELDS = {"message_type": "message_types", "contract": "contracts", "queue": "queues",
          "service": "services", "route": "routes"}


def records(catalog: Catalog) -> dict[str, bytes]:
    """key -> JSON value of every object the catalog topic holds (built-ins are implicit)."""
    builtin = {"message_types": BUILTIN_MESSAGE_TYPES, "contracts": BUILTIN_CONTRACTS}
    out: dict[str, bytes] = {}
    for kind, field in FIELDS.items():
        for name, obj in getattr(catalog, field).items():
            if builtin.get(field, {}).get(name) != obj:
                out[f"{kind}/{name}"] = orjson.dumps(obj.model_dump(mode="json"))
    return out


def _topic_exists(client: Producer | Consumer, topic: str, timeout: float) -> bool:
    # Ask for all topics: a metadata request naming the topic could auto-create it.
    try:
        return topic in client.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error("cannot read topic metadata", exc.args[0]) from None


def publish(bootstrap: str, catalog: Catalog, previous: Catalog | None = None, timeout: float = 30.0) -> int:
    """Write the catalog's objects to its topic; with `previous`, only those that changed.
    Returns how many records were written. The topic must exist (see apply.ensure_system_topics)."""
    old = records(previous) if previous is not None else {}
    todo = {k: v for k, v in records(catalog).items() if old.get(k) != v}
    write_records(bootstrap, names.catalog_topic(catalog.namespace), todo, timeout)
    return len(todo)


def publish_object(bootstrap: str, namespace: str, kind: str, obj: BaseModel, timeout: float = 30.0) -> None:
    """Write one catalog object (e.g. ALTER QUEUE's changed queue); every reader sees it on its
    next read of the catalog."""
    if kind not in FIELDS:
        raise ValueError(f"unknown catalog kind {kind!r} (one of {', '.join(FIELDS)})")
    value = orjson.dumps(obj.model_dump(mode="json"))
    write_records(bootstrap, names.catalog_topic(namespace), {f"{kind}/{obj.name}": value}, timeout)


def write_records(bootstrap: str, topic: str, todo: dict[str, bytes], timeout: float) -> None:
    """Produce key -> value records to an existing kbroker topic; returns once all are acknowledged."""
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "logger": KAFKA_LOG,
        "enable.idempotence": True,  # retries never duplicate or reorder catalog records
        "allow.auto.create.topics": False,  # an auto-created topic would not be compacted
        "message.timeout.ms": int(timeout * 1000),
    })
    if not _topic_exists(producer, topic, timeout):
        raise CatalogError(f"topic {topic} does not exist: run 'kbroker apply' first")
    errors: list[KafkaError] = []
    for key, value in todo.items():
        producer.produce(topic, key=key.encode(), value=value,
                         on_delivery=lambda err, _msg: err and errors.append(err))
        producer.poll(0)
    remaining = producer.flush(timeout)
    if errors:
        raise kafka_error(f"publishing to {topic} failed", errors[0])
    if remaining:
        raise BrokerUnavailableError(f"publishing to {topic}: {remaining} records not acknowledged in {timeout}s")


def read_catalog(bootstrap: str, namespace: str, timeout: float = 10.0) -> Catalog:
    """The namespace's catalog as published; only the built-ins when the topic does not exist."""
    topic = names.catalog_topic(namespace)
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "logger": KAFKA_LOG,
        "group.id": f"{names.prefix(namespace)}catalog-reader",  # never joined: partitions are assigned
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "allow.auto.create.topics": False,
    })
    try:
        if not _topic_exists(consumer, topic, timeout):
            return Catalog(namespace=namespace)
        return _rebuild(namespace, _read_to_end(consumer, topic, timeout))
    finally:
        consumer.close()


def _read_to_end(consumer: Consumer, topic: str, timeout: float) -> dict[str, bytes | None]:
    deadline = time.monotonic() + timeout
    partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
    ends: dict[int, int] = {}
    for p in partitions:
        low, high = _watermarks(consumer, TopicPartition(topic, p), deadline)
        if high > low:
            ends[p] = high
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    latest: dict[str, bytes | None] = {}
    while ends:
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(f"reading {topic} did not reach its end within {timeout}s")
        msg = consumer.poll(0.2)
        if msg is not None:
            if msg.error():
                if msg.error().fatal():
                    raise kafka_error(f"reading {topic} failed", msg.error())
                continue
            latest[msg.key().decode()] = msg.value()  # later records replace earlier ones
        # Positions, not message offsets: transaction markers advance the position silently.
        for tp in consumer.position([TopicPartition(topic, p) for p in list(ends)]):
            if tp.offset >= ends[tp.partition]:
                del ends[tp.partition]
    return latest


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    # A topic created a moment ago may have no leader yet ("not leader for partition", which
    # librdkafka does not flag retriable here): retry until the deadline, then report the error.
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or time.monotonic() > deadline:
                raise kafka_error(f"cannot read the end offsets of {tp.topic}", err) from None
            time.sleep(0.1)


def _rebuild(namespace: str, latest: dict[str, bytes | None]) -> Catalog:
    fields: dict[str, dict] = {field: {} for field in FIELDS.values()}
    for key, value in latest.items():
        kind, _, name = key.partition("/")
        if kind not in FIELDS or value is None:
            continue  # a tombstone, or a kind written by a newer kbroker
        fields[FIELDS[kind]][name] = orjson.loads(value)
    try:
        return Catalog.model_validate({"namespace": namespace, **fields})
    except ValidationError as exc:
        reason = pydantic_reason(exc)
        raise CatalogError(f"the catalog topic of {namespace!r} holds an invalid object: {reason}") from None
