"""`kbroker drop KIND NAME`: DROP MESSAGE TYPE, CONTRACT, QUEUE, SERVICE, ROUTE and XML SCHEMA
COLLECTION on the catalog topic. The rules are core/catalog/drops.py's, checked against the
catalog as published; the drop itself is the object's tombstone (a null value), which every
process's catalog watcher reads as the object gone.

A dropped queue's topics are kept unless `delete_topics`: deleting a Kafka topic cannot be
undone, and its records (messages not yet received) are the only copy (docs/catalog.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from kbroker.core import names
from kbroker.core.catalog.catalog_records import KINDS
from kbroker.core.catalog.drops import DROP_KINDS, check_drop
from kbroker.core.catalog.models import Catalog
from kbroker.core.cluster import ClusterLike
from kbroker.errors import kafka_error
from kbroker.kafka import clients
from kbroker.kafka.catalog.catalog_store import read_catalog, write_records

# Catalog field -> the catalog topic's record kind
RECORD_KIND = {field: kind for kind, (field, _) in KINDS.items()}


@dataclass
class DropReport:
    namespace: str
    kind: str
    name: str
    dialogs_ended: list[str] = field(default_factory=list)  # DROP SERVICE: the handles closed
    topics_deleted: list[str] = field(default_factory=list)
    topics_kept: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_topics(cluster: ClusterLike, catalog: Catalog, queue: str, timeout: float) -> list[str]:
    """The topics of `queue` that exist: its own and its secondary queues' (`<topic>.<instance>`,
    an instance has no '.'), not another queue's whose name merely starts the same."""
    base = names.queue_topic(catalog.namespace, queue)
    others = {names.queue_topic(catalog.namespace, q) for q in catalog.queues if q != queue}
    try:
        topics = clients.admin(cluster).list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    return sorted(
        t
        for t in topics
        if t not in others
        and (t == base or (t.startswith(base + ".") and names.INSTANCE_RE.fullmatch(t[len(base) + 1 :])))
    )


def drop_object(
    cluster: ClusterLike,
    namespace: str,
    kind: str,
    name: str,
    *,
    delete_topics: bool = False,
    timeout: float = 30.0,
    catalog: Catalog | None = None,
) -> DropReport:
    """Drop one object (KIND of core/catalog/drops.DROP_KINDS) from the namespace's catalog;
    DropRefusedError / DropNotFoundError before anything is written. `catalog`: the catalog as
    published, when the caller has just read it."""
    if kind not in DROP_KINDS:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(DROP_KINDS)})")
    catalog = catalog if catalog is not None else read_catalog(cluster, namespace, timeout=timeout)
    field_name = check_drop(catalog, kind, name)
    report = DropReport(namespace, kind, name)
    topics = queue_topics(cluster, catalog, name, timeout) if field_name == "queues" else []
    write_records(cluster, names.catalog_topic(namespace), {f"{RECORD_KIND[field_name]}/{name}": None}, timeout)
    if topics and delete_topics:
        admin = clients.admin(cluster)
        for topic, future in admin.delete_topics(topics, operation_timeout=timeout).items():
            try:
                future.result()
            except KafkaException as exc:
                raise clients.denied(
                    cluster, exc.args[0], f"cannot delete topic {topic}", topic=("DELETE", topic)
                ) from None
            report.topics_deleted.append(topic)
    else:
        report.topics_kept = topics
    return report
