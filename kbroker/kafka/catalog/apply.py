"""`kbroker apply`: validate definitions, make Kafka's topics match them, publish the catalog.

Order matters: everything is validated first (the definitions, then the plan against the topics
that exist, e.g. no queue shrinks, and a used queue keeps its partition count: queue_in_use), so
an invalid apply changes nothing. Then topics are created,
reconfigured and grown, and only then are the objects published: a process that sees a queue in
the catalog can rely on its topic existing.

Apply is additive: objects missing from the files are left in the catalog; `kbroker drop` removes
one (drop.py). A published contract's messages are fixed (core/catalog/drops.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from kbroker.core import names
from kbroker.core.catalog.drops import check_contracts_fixed, keep_statuses, merged, plan_drops, stamp_validations
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import Catalog
from kbroker.core.catalog.queue_keys import check_queue_keys, stamp_keys
from kbroker.core.cluster import ClusterLike
from kbroker.core.routing.routes import stamp_routes
from kbroker.core.topic_limits import HEADER_HEADROOM as HEADER_HEADROOM  # re-exported: tests read it here
from kbroker.errors import DefinitionError, InvalidArgumentError, TopicCollisionError, kafka_error
from kbroker.kafka import clients
from kbroker.kafka.catalog.catalog_store import publish, read_catalog, records
from kbroker.kafka.catalog.drop import DropReport, drop_object
from kbroker.kafka.catalog.topic_specs import RETENTION_KEYS, TopicSpec, topic_specs
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.topic_propagation import await_topics

Progress = Callable[[str], None] | None
# Runs one drop of a drop: list, (kind, name) -> its report; sdk/catalog_drop.py's also ends a
# dropped service's dialogs.
Dropper = Callable[[str, str], DropReport]


@dataclass
class ApplyReport:
    topics_created: list[str] = field(default_factory=list)
    topics_updated: list[str] = field(default_factory=list)
    retention_changed: list[str] = field(default_factory=list)  # "topic: retention.ms 604800000 -> -1"
    objects_published: int = 0
    namespace: str = ""
    dropped: list[str] = field(default_factory=list)  # the files' drop: list as run ("service S")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_replication(brokers: int, requested: int | None = None) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of the topics apply creates on a cluster of
    `brokers`: `requested` replicas when given, else as many as there are brokers up to three.
    Two replicas must be in sync once there are three, so a node may be lost without losing an
    acknowledged write or stopping writes; with fewer, one.
    InvalidArgumentError for an impossible request."""
    if requested is not None and not 1 <= requested <= brokers:
        raise InvalidArgumentError(
            f"replication factor {requested} is impossible: the cluster has "
            f"{brokers} broker{'s' if brokers != 1 else ''} (choose 1 to {brokers})"
        )
    replicas = requested if requested is not None else max(1, min(3, brokers))
    return replicas, 2 if replicas >= 3 else 1


def _wait(
    cluster: ClusterLike,
    futures: Mapping[Any, Future[Any]],
    what: str,
    operation: str,
    tolerate: tuple[int, ...] = (),
    collision: Callable[[KafkaError, str], Exception | None] = lambda err, name: None,
) -> set[str]:
    """Wait for admin futures on topics; returns the names whose error was tolerated. A refusal
    names `operation` on the topic; `collision` makes an error a typed one first."""
    tolerated: set[str] = set()
    for key, future in futures.items():
        name = getattr(key, "name", key)
        try:
            future.result()
        except KafkaException as exc:
            typed = collision(exc.args[0], name)
            if typed is not None:
                raise typed from None
            if exc.args[0].code() not in tolerate:
                raise clients.denied(cluster, exc.args[0], f"{what} {name}", topic=(operation, name)) from None
            tolerated.add(name)
    return tolerated


def sync_topics(
    cluster: ClusterLike,
    specs: list[TopicSpec],
    origins: dict[str, str] | None = None,
    progress: Progress = None,
    timeout: float = 30.0,
    replication_factor: int | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """Create missing topics, set changed configs, grow partitions. Returns (created, updated,
    retention changes: one line per retention setting changed on an existing topic).
    Raises DefinitionError before changing anything if a topic would have to shrink. Topics are
    created with `replication_factor` replicas, by default as choose_replication picks for the
    cluster; existing topics keep theirs."""
    say = progress or (lambda _msg: None)
    admin = clients.admin(cluster)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise kafka_error(f"no Kafka broker answers at {cluster}", exc.args[0]) from None
    existing = metadata.topics
    replicas, min_insync = choose_replication(len(metadata.brokers), replication_factor)

    # 1. plan (read-only)
    missing = [s for s in specs if s.name not in existing]
    by_name = {s.name: s for s in missing}
    _refuse_kafka_collisions(missing, list(existing), origins or {})
    present = [s for s in specs if s.name in existing]
    grow: list[TopicSpec] = []
    for s in present:
        have = len(existing[s.name].partitions)
        if s.may_grow and s.partitions < have:
            raise DefinitionError(
                (origins or {}).get(s.owner),
                s.owner,
                f"partitions cannot shrink from {have} to {s.partitions} (topic {s.name})",
            )
        if s.may_grow and s.partitions > have:
            used = (
                queue_in_use(admin, s.name, sorted(existing[s.name].partitions), timeout)
                if s.grows_while_unused
                else None
            )
            if used:
                raise DefinitionError(
                    (origins or {}).get(s.owner),
                    s.owner,
                    f"partitions cannot grow from {have} to {s.partitions}: {used}, and a "
                    "conversation group keeps its partition for life (define a new queue)",
                )
            grow.append(s)
    resources = [ConfigResource(ResourceType.TOPIC, s.name) for s in present]
    current: dict[str, dict[str, str]] = {}
    if resources:
        for res, future in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                current[res.name] = {k: e.value for k, e in future.result().items()}
            except KafkaException as exc:
                raise clients.denied(
                    cluster, exc.args[0], f"cannot describe topic {res.name}", topic=("DESCRIBE_CONFIGS", res.name)
                ) from None
    alter = [s for s in present if any(current[s.name].get(k) != v for k, v in s.config.items())]
    retention = [
        f"{s.name}: {key} {current[s.name].get(key)} -> {s.config[key]}"
        for s in alter
        for key in RETENTION_KEYS
        if key in s.config and current[s.name].get(key) != s.config[key]
    ]

    # 2. change
    raced: set[str] = set()
    if missing:
        say(f"creating {len(missing)} topics")
        # min.insync.replicas only at creation: it must stay consistent with the topic's own
        # replication factor, which a later apply with another choice does not change.
        new = [
            NewTopic(
                s.name,
                num_partitions=s.partitions,
                replication_factor=replicas,
                config={**s.config, "min.insync.replicas": str(min_insync)},
            )
            for s in missing
        ]
        # Another apply may create the same topic at the same time: not a failure, not ours.
        raced = _wait(
            cluster,
            admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout),
            "cannot create topic",
            "CREATE",
            tolerate=(KafkaError.TOPIC_ALREADY_EXISTS,),
            collision=lambda err, name: _collision(err, by_name.get(name), origins or {}),
        )
    if alter:
        say(f"updating the config of {len(alter)} topics")
        for line in retention:
            say(f"retention changed, {line}")
        changes = [
            ConfigResource(
                ResourceType.TOPIC,
                s.name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in s.config.items()
                ],
            )
            for s in alter
        ]
        _wait(
            cluster,
            admin.incremental_alter_configs(changes, request_timeout=timeout),
            "cannot configure topic",
            "ALTER_CONFIGS",
        )
    if grow:
        say(f"adding partitions to {len(grow)} topics")
        _wait(
            cluster,
            admin.create_partitions(
                [NewPartitions(s.name, s.partitions) for s in grow], operation_timeout=timeout, request_timeout=timeout
            ),
            "cannot grow topic",
            "ALTER",
        )
    late = await_topics(cluster, admin, [s.name for s in missing], timeout)
    if late:
        say(
            f"warning: {', '.join(late)} did not know every new topic after {timeout:g} s; a client "
            "asking there may find a topic missing for a while"
        )
    updated = sorted({s.name for s in alter} | {s.name for s in grow})
    return [s.name for s in missing if s.name not in raced], updated, retention


def _refuse_kafka_collisions(missing: list[TopicSpec], existing: list[str], origins: dict[str, str]) -> None:
    """DefinitionError naming both topics when a topic to create would collide in Kafka with one
    that exists or is also to be created (names.kafka_form), whatever the namespace: said here,
    before anything changes, rather than by CreateTopics halfway through."""
    taken = {names.kafka_form(t): t for t in existing}
    for s in missing:
        other = taken.setdefault(names.kafka_form(s.name), s.name)
        if other != s.name:
            raise TopicCollisionError(origins.get(s.owner), s.owner, s.name, other)


def _collision(err: KafkaError, spec: TopicSpec | None, origins: dict[str, str]) -> TopicCollisionError | None:
    """CreateTopics' refusal of a topic that collides with one this principal may not see (another
    namespace's, hidden by its ACLs, so _refuse_kafka_collisions could not): Kafka names it."""
    found = _COLLIDES.search(err.str()) if err.code() == KafkaError.TOPIC_EXCEPTION else None
    if found is None or spec is None:
        return None
    return TopicCollisionError(origins.get(spec.owner), spec.owner, spec.name, found["other"].strip("'\"[] "))


_COLLIDES = re.compile(r"collides with existing topics?:?\s*(?P<other>\S+)")


def queue_in_use(admin: AdminClient, topic: str, partitions: list[int], timeout: float) -> str | None:
    """Why a queue topic may no longer change its partition count (None: never used).

    A record's partition is its conversation group's hash modulo the partition count, so a
    new count moves groups. Once the queue has held a message or had a reader, a producer that
    still has the old count (librdkafka refreshes it every 5 minutes) and one that has the new
    count would put one group's messages on two partitions, where two readers could hold that
    group at once, and out of order (G1). So the count is fixed at first use, as a partitioned
    Azure Service Bus entity's is at creation; a queue that needs more is a new queue."""
    for partition, end in clients.end_offsets(admin, topic, partitions, time.monotonic() + timeout).items():
        if end > 0:
            return f"the queue has held messages (partition {partition} ends at offset {end})"
    group = clients.result_of(
        admin.describe_consumer_groups([topic], request_timeout=timeout)[topic],
        f"cannot describe the readers of {topic}",
    )
    if group.members:
        return f"the queue has {len(group.members)} readers"
    return None


def refuse_shadowing(namespace: str) -> None:
    """TopicCollisionError for a namespace whose topics lie in another namespace's queue space
    (names.shadowed_namespace), whether or not that one exists yet: neither may block the other."""
    shadowed = names.shadowed_namespace(namespace)
    if shadowed is not None:
        other, space = shadowed
        raise TopicCollisionError(
            None,
            f"namespace {namespace}",
            names.prefix(namespace) + "*",
            space + "*",
            f"namespace {other}'s queues may take these names (choose a namespace "
            f"without '_{space.rstrip('.').rpartition('.')[2]}')",
        )


def ensure_system_topics(
    cluster: ClusterLike, namespace: str, timeout: float = 30.0, replication_factor: int | None = None
) -> ApplyReport:
    """Create (or reconfigure) the namespace's system topics as kbroker/core/catalog/system.yaml says."""
    refuse_shadowing(namespace)
    specs = topic_specs(Catalog(namespace=namespace))  # names.* validate the namespace
    created, updated, retention = sync_topics(cluster, specs, timeout=timeout, replication_factor=replication_factor)
    return ApplyReport(created, updated, retention, 0, namespace)


def apply_paths(
    cluster: ClusterLike,
    namespace: str,
    paths: Iterable[str | Path],
    progress: Progress = None,
    timeout: float = 30.0,
    replication_factor: int | None = None,
    dropper: Dropper | None = None,
) -> ApplyReport:
    """Validate the definitions under `paths`, create/update their topics, publish the catalog."""
    catalog = load_definitions(paths, namespace)
    if progress:
        progress(f"validated {len(catalog.queues)} queues and {len(catalog.services)} services")
    return apply_catalog(cluster, catalog, progress, timeout, replication_factor, dropper)


def record_repaired(
    cluster: ClusterLike, catalog: Catalog, bad: dict[bytes | None, tuple[Any, str]], timeout: float
) -> None:
    """The bad records this apply just superseded with the object they replaced (read_catalog
    left those objects out, so publish wrote them again) are recorded here, as their repairer:
    a later 5th-tick scan no longer finds them last of their key (kafka/rejects.py)."""
    written = {key.encode() for key in records(catalog)}
    repaired = [(msg, reason) for key, (msg, reason) in bad.items() if key in written]
    if repaired:
        rejects = Rejects(cluster, catalog.namespace, "kbroker apply")
        for msg, reason in repaired:
            rejects.reject(msg, reason)
        rejects.close(timeout)


def apply_catalog(
    cluster: ClusterLike,
    catalog: Catalog,
    progress: Progress = None,
    timeout: float = 30.0,
    replication_factor: int | None = None,
    dropper: Dropper | None = None,
) -> ApplyReport:
    """Apply an already validated catalog (from load_definitions); new topics get
    `replication_factor` replicas (default: see choose_replication). Its drop: list is checked
    with the rest, before anything changes, and run after the objects are published, by
    `dropper` (default: the catalog record alone, kafka/catalog/drop.py)."""
    refuse_shadowing(catalog.namespace)
    clients.brokers_answering(cluster, timeout)  # "no Kafka broker answers at ...", not a metadata error
    bad: dict[bytes | None, tuple[Any, str]] = {}  # keys whose last record is not a catalog object
    previous = read_catalog(cluster, catalog.namespace, timeout=timeout, last_bad=bad)
    # Before any topic changes: each queue's topic key (kept, or new), checked against the
    # queues applied earlier, which are part of the namespace's names.
    catalog = stamp_keys(catalog, previous)
    check_queue_keys(catalog, previous)
    check_contracts_fixed(previous, catalog)  # no ALTER CONTRACT: refused before any topic changes
    drops = plan_drops(merged(previous, catalog), catalog.drops)  # DropRefusedError: nothing changed
    created, updated, retention = sync_topics(
        cluster, topic_specs(catalog), catalog.origins, progress, timeout, replication_factor
    )
    # A route's LIFETIME counts from when it was first published as it is now (routing.py).
    catalog = stamp_routes(catalog, previous.routes, time.time())
    catalog = stamp_validations(catalog, previous, time.time())  # ALTER MESSAGE TYPE spares queued ones
    catalog = keep_statuses(catalog, previous)  # a disabled queue stays so unless a file names its status
    published = publish(cluster, catalog, previous=previous, timeout=timeout)
    record_repaired(cluster, catalog, bad, timeout)
    if progress:
        progress(f"published {published} catalog records")
    run = dropper or (lambda kind, name: drop_object(cluster, catalog.namespace, kind, name, timeout=timeout))
    done: list[str] = []
    for kind, name in drops:
        run(kind, name)
        done.append(f"{kind} {name}")
        if progress:
            progress(f"dropped {kind} {name}")
    return ApplyReport(created, updated, retention, published, catalog.namespace, done)
