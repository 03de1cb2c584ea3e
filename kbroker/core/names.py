"""Kafka topic and consumer-group names. Pure functions: the one place that knows the layout.

Everything of namespace `ns` lives under the prefix `kbroker.<ns>.`, so namespaces never see each
other's topics and one ACL prefix covers a namespace:

    kbroker.<ns>.queue.<queue>     one topic per queue (and the consumer group that reads it)
    kbroker.<ns>.queue.<queue>.<instance>   a queue's secondary queue for one instance (callbacks)
    kbroker.<ns>.tqueue.<queue>    a transport queue (core/transport/endpoint.py), read by the group of its name
    kbroker.<ns>.catalog           compacted: the catalog objects
    kbroker.<ns>.endpoints         compacted: conversation endpoints
    kbroker.<ns>.events            broker events (activation, queue monitors, ...)
    kbroker.<ns>.deadletter        poison messages taken off their queue
    kbroker.<ns>.transmission      the transmission queue (messages not yet delivered)
    kbroker.<ns>.timers            compacted: armed dialog timers and dialog lifetimes
    kbroker.<ns>.readers           compacted: each reading process's locks and in-flight counts
    kbroker.<ns>.progress          the worker's snapshots of each queue group's committed offsets
    kbroker.<ns>.analytics         the Spark job's results: queue windows and dialog classes
    kbroker.<ns>.control           commands to the worker (reclassify a dialog)
    kbroker.<ns>.inbound           messages other namespaces' transmitters sent here, not yet saved
    kbroker.<ns>.acks              compacted: per dialog direction, the next sequence number expected
    kbroker.<ns>.transport         compacted: each transmitter's connections and waiting messages

and so do the consumer groups (`kbroker.<ns>.reader` for kbroker's assign-only readers) and the
transactional ids (`kbroker.<ns>.<uuid>`, `kbroker.<ns>.timers.<uuid>`, ...): a namespace's
PREFIXED ACLs cover everything its processes touch (core/security/acl_roles.py).

Two names must never be one topic, nor two topics Kafka refuses side by side: Kafka treats '.'
and '_' as one character when it compares topic names (kafka_form). A queue may have any name
Service Broker allows (a sysname: 1-128 characters, any but control characters), so its topic
holds the queue's *key* (queue_key), an injective encoding into what Kafka allows: a name of
1-100 letters, digits and '-' is its own key; any other is '_' and the name with every other
character written `-<hex code>-`, or, past 120 characters, '__', the start of that and a hash
(encoded_key). Keys hold no '.' and no '_' but the leading ones, so no two keys meet in Kafka's
form, nor a key and a secondary queue `<key>.<instance>` (instance names hold no '.').

Queues published before keys existed keep the topic they have: their key is their name (a name
of letters, digits, '_', '.' and '-' was its topic then), which the catalog says (Queue.topic_key)
and remember_keys records for this process. Such an old key can meet another key in Kafka's form
or claim its space, so apply still compares keys (queue_names_collide); between keys encoded here
it never finds one. For the transport face, the same check runs on its queue names at install
(core/transport/endpoint.py). A secondary queue is refused when it would meet another queue's
topic (secondary_queue_collision).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Iterable, Mapping

from kbroker.config import NAMESPACE_RE
from kbroker.core.topic_keys import decoded_key, encoded_key, queue_name_problem

# The queue names releases before keys took, each its own topic's: their topics keep that layout.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
SYSTEM_TOPICS = (
    "catalog",
    "endpoints",
    "events",
    "deadletter",
    "transmission",
    "timers",
    "readers",
    "progress",
    "analytics",
    "control",
    "inbound",
    "acks",
    "transport",
    "holds",
)


def _ns(ns: str) -> str:
    if not isinstance(ns, str) or not NAMESPACE_RE.fullmatch(ns):
        raise ValueError(f"namespace {ns!r} must be 1-40 characters of letters, digits, '_' or '-'")
    return ns


@functools.lru_cache(maxsize=1024)
def prefix(ns: str) -> str:
    """The prefix of every topic (and group) of the namespace, e.g. `kbroker.sales.`. Remembered
    (as the names below that every SEND asks for): a SEND asked for them about five times."""
    return f"kbroker.{_ns(ns)}."


def namespace_of(name: str) -> str | None:
    """The namespace of a topic (or group) named under a namespace's prefix, else None."""
    head, _, rest = name.partition(".")
    ns, dot, _tail = rest.partition(".")
    return ns if head == "kbroker" and dot and NAMESPACE_RE.match(ns) else None


def reader_group(ns: str) -> str:
    """The group id of every consumer kbroker only assigns partitions to (catalog, endpoints and
    events readers, views, the reclaim's reads): it never joins the group nor commits, but
    librdkafka looks the group's coordinator up, which a secured cluster allows only to a
    principal that may DESCRIBE the group. So it lies under the namespace's prefix too."""
    return f"{prefix(ns)}reader"


def reader_group_of(topic: str) -> str | None:
    """The readers' group of the namespace `topic` belongs to; None for a topic of none."""
    ns = namespace_of(topic)
    return reader_group(ns) if ns else None


# Keys the catalog gave that differ from encoded_key (queues published before keys existed), and
# back from those and from hashed keys to their queues. Bounded by the catalogs read.
_KEPT: dict[tuple[str, str], str] = {}
_KEPT_BY_KEY: dict[tuple[str, str], str] = {}


def remember_keys(ns: str, keys: Mapping[str, str]) -> None:
    """Record the keys a namespace's catalog gives its queues (queue -> key), for queue_topic
    and queue_of_topic in this process: the catalog's reader and apply call it."""
    changed = False
    for queue, key in keys.items():
        kept = key if key != encoded_key(queue) else None  # None: a queue made again gets its key
        if _KEPT.get((ns, queue)) != kept:
            if kept is None:
                _KEPT.pop((ns, queue), None)
            else:
                _KEPT[(ns, queue)] = kept
            changed = True
        if (kept is not None or decoded_key(key) is None) and _KEPT_BY_KEY.get((ns, key)) != queue:
            _KEPT_BY_KEY[(ns, key)] = queue  # a hashed key's topic says no name
            changed = True
    if changed:
        queue_topic.cache_clear()
        queue_of_topic.cache_clear()


def queue_key(ns: str, queue: str) -> str:
    """The key in `queue`'s topic name: the catalog's, else encoded_key. ValueError for a name
    Service Broker would refuse."""
    problem = queue_name_problem(queue)
    if problem is not None:
        raise ValueError(f"queue name {queue!r} {problem}")
    return _KEPT.get((ns, queue)) or encoded_key(queue)


@functools.lru_cache(maxsize=4096)
def queue_topic(ns: str, queue: str) -> str:
    return f"{prefix(ns)}queue.{queue_key(ns, queue)}"


INSTANCE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # no '.': the topic name must stay unambiguous


def secondary_queue_topic(ns: str, queue: str, instance: str) -> str:
    """The per-instance secondary queue of `queue` (NServiceBus callbacks): `<queue topic>.<instance>`,
    read by the consumer group of the same name."""
    if not isinstance(instance, str) or not INSTANCE_RE.fullmatch(instance):
        raise ValueError(f"instance name {instance!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
    return f"{queue_topic(ns, queue)}.{instance}"


def kafka_form(name: str) -> str:
    """The form in which Kafka compares topic names: two topics whose forms are equal collide
    (CreateTopics refuses the second one, their metric names clash)."""
    return name.replace(".", "_")


QUEUE_SPACES = ("queue", "tqueue")  # the parts of a namespace named by its users' queues


def shadowed_namespace(ns: str) -> tuple[str, str] | None:
    """(namespace, its queue space) whose topics `ns`'s topics could collide with in Kafka, else
    None. Namespaces hold no '.', so the topics of two namespaces can only meet when one's name
    is the other's, '_', and one of the other's queue spaces: every topic of `a_queue`
    (`kbroker.a_queue.catalog`) is, in Kafka's form, a queue topic `a` may name
    (`kbroker.a.queue.catalog`), and whichever comes second could not be created. Such a
    namespace is refused at apply, so no namespace's queue names can block another's topics."""
    parts = _ns(ns).split("_")
    for i in range(1, len(parts)):
        if parts[i] in QUEUE_SPACES and parts[0]:
            other = "_".join(parts[:i])
            return other, f"{prefix(other)}{parts[i]}."
    return None


def queue_names_collide(a: str, b: str) -> str | None:
    """Why queues (or transport queues) `a` and `b` may not live in one namespace, or None.

    A queue owns its name and, for its secondary queues, every name that is its own followed by
    '.' and more (as Kafka compares names, '_' too). Two queues collide when one's Kafka form
    equals the other's or lies in the other's secondary space. Between queues that do not
    collide, no topic of the one (queue or secondary) can equal or Kafka-collide with a topic of
    the other: a secondary `q.i` has the form kafka_form(q) + '_' + i, so an equal form of
    another queue's topic would put one queue's form inside the other's space."""
    if a == b:
        return None
    if kafka_form(a) == kafka_form(b):
        return "Kafka treats '.' and '_' in topic names as one character, so their topics collide"
    short, long = sorted((a, b), key=len)
    if kafka_form(long).startswith(kafka_form(short) + "_"):
        return f"names {short}.<instance> (or {short}_...) belong to {short}'s secondary queues"
    return None


def secondary_queue_collision(ns: str, queues: Iterable[str], queue: str, instance: str) -> tuple[str, str] | None:
    """(other queue, reason) when `queue`'s secondary queue for `instance` would be, or collide in
    Kafka with, another queue's topic or secondary queue; None when it is free. The instance
    must match INSTANCE_RE (secondary_queue_topic checks). Only a key kept from before keys
    existed can be met (see the module's docstring)."""
    secondary = kafka_form(f"{queue_key(ns, queue)}.{instance}")
    for other in queues:
        if other == queue:
            continue
        form = kafka_form(queue_key(ns, other))
        if secondary == form:
            return other, "it would be that queue's topic, or one Kafka refuses beside it ('.' and '_' are one)"
        if secondary.startswith(form + "_"):
            return other, f"names {other}.<instance> belong to {other}'s secondary queues"
    return None


def queue_group(ns: str, queue: str) -> str:
    """Consumer group of the readers of a queue: the same string as the queue's topic."""
    return queue_topic(ns, queue)


@functools.lru_cache(maxsize=4096)
def queue_of_topic(ns: str, topic: str) -> str | None:
    """The queue name of a queue topic of this namespace (`<queue>.<instance>` for a secondary
    queue's), else None. A key neither remembered nor decodable (a hashed one this process's
    catalog has not named) stands for itself."""
    head = f"{prefix(ns)}queue."
    if not topic.startswith(head) or len(topic) == len(head):
        return None
    key = topic[len(head) :]
    known = _KEPT_BY_KEY.get((ns, key)) or decoded_key(key)
    if known is not None:
        return known
    base, dot, instance = key.rpartition(".")
    if dot and INSTANCE_RE.fullmatch(instance):
        queue = _KEPT_BY_KEY.get((ns, base)) or decoded_key(base)
        if queue is not None:
            return f"{queue}.{instance}"
    return key  # a key kept from before keys existed, or hashed


def queue_label(ns: str, topic: str, queues: Container[str]) -> str:
    """The queue a record to `topic` goes to, as a metrics label: one of `queues` (a secondary
    queue counts as its queue: instances come and go), or "" for any other topic (a routed
    message, on its way to another namespace's queue)."""
    queue = queue_of_topic(ns, topic)
    if queue is None:
        return ""
    if queue in queues:
        return queue
    head = queue.rpartition(".")[0]
    return head if head in queues else ""


def system_topic(ns: str, name: str) -> str:
    if name not in SYSTEM_TOPICS:
        raise ValueError(f"unknown system topic {name!r} (one of {', '.join(SYSTEM_TOPICS)})")
    return f"{prefix(ns)}{name}"


def catalog_topic(ns: str) -> str:
    return system_topic(ns, "catalog")


def endpoints_topic(ns: str) -> str:
    return system_topic(ns, "endpoints")


def holds_topic(ns: str) -> str:
    """Conversation group holds across processes (core/dialogs/group_hold.py)."""
    return system_topic(ns, "holds")


def events_topic(ns: str) -> str:
    return system_topic(ns, "events")


def deadletter_topic(ns: str) -> str:
    return system_topic(ns, "deadletter")


def transmission_topic(ns: str) -> str:
    return system_topic(ns, "transmission")


def timers_topic(ns: str) -> str:
    return system_topic(ns, "timers")


def timers_group(ns: str) -> str:
    """The consumer group of the timer service instances."""
    return f"{prefix(ns)}timers"


def readers_topic(ns: str) -> str:
    return system_topic(ns, "readers")


def progress_topic(ns: str) -> str:
    """Receive progress: the worker's periodic snapshot of each queue group's committed offsets."""
    return system_topic(ns, "progress")


def analytics_topic(ns: str) -> str:
    """The analytics job's results (docs/analytics.md): queue windows and dialog classes."""
    return system_topic(ns, "analytics")


def control_topic(ns: str) -> str:
    """Commands to the namespace's workers: RECLASSIFY from the analytics job."""
    return system_topic(ns, "control")


def analytics_group(ns: str) -> str:
    """The consumer group whose committed offsets say how far the analytics job has read each
    queue topic: the 5th-tick reclaim keeps what it has not read (core/receive/reclaim.py)."""
    return f"{prefix(ns)}analytics"


def analytics_source_groups(ns: str) -> str:
    """The prefix of the consumer groups Spark's Kafka source makes for the analytics job
    (its groupIdPrefix): under the namespace's prefix, where its ACLs are."""
    return f"{prefix(ns)}analytics-source"


def analytics_transactional_id(ns: str) -> str:
    """The analytics job's producer: one id per namespace, so a second job fences the first."""
    return f"{prefix(ns)}analytics-job"


# A new namespace's monitor-events topic: a queue's monitor, and so its activated readers, runs on
# the worker holding the queue's partition, so this many workers at most share a namespace's
# monitors. A topic that exists keeps its count (the monitor table's changelog matches it).
MONITOR_PARTITIONS = 16


def monitor_events_topic(ns: str) -> str:
    """The worker's queue monitor events (key: queue name; MONITOR_PARTITIONS partitions when new)."""
    return f"{prefix(ns)}monitor-events"


def ticks_topic(ns: str) -> str:
    """Tick requests of the workers; one partition, so each tick is decided once per cluster."""
    return f"{prefix(ns)}ticks"


def worker_app_id(ns: str) -> str:
    """The worker's Faust app id: its consumer group and the prefix of its changelog topics."""
    return f"{prefix(ns)}worker"


def monitors_changelog_topic(ns: str) -> str:
    return f"{worker_app_id(ns)}-monitors-changelog"


def tick_owner_changelog_topic(ns: str) -> str:
    return f"{worker_app_id(ns)}-tick-owner-changelog"


def inbound_topic(ns: str) -> str:
    """Messages sent to this namespace from other namespaces, before the dispatcher saves them."""
    return system_topic(ns, "inbound")


def acks_topic(ns: str) -> str:
    """The dispatcher's acknowledgements: the next sequence number it expects per dialog direction."""
    return system_topic(ns, "acks")


def link_reports_topic(ns: str) -> str:
    """The transmitters' and forwarders' reports on their links (sys.transmission_queue statuses,
    sys.dm_broker_connections). The topic keeps the name it was created with, `transport`."""
    return system_topic(ns, "transport")


def transmitter_group(ns: str) -> str:
    """The consumer group of the transmitters: its offsets are the transmission queue's head."""
    return f"{prefix(ns)}transmitter"


def dispatcher_group(ns: str) -> str:
    """The consumer group of the dispatchers reading the inbound topic."""
    return f"{prefix(ns)}dispatcher"
