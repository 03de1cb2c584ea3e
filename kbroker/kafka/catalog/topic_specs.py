"""The topics a catalog needs and their Kafka configs: what `kbroker apply` makes the cluster match.

Apart from apply.py, which does the matching, because the transport queues and the secondary
queues build their topics from the same specs and configs without applying a catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.core import names
from kbroker.core.catalog.loader import load_system_topics
from kbroker.core.catalog.models import Catalog, Queue, SystemTopic
from kbroker.core.topic_limits import queue_limit, system_topic_limit

# Kafka deletes nothing by age or size: what holds messages is reclaimed by kbroker (reclaim.py).
KEEP_EVERY_RECORD = {"retention.ms": "-1", "retention.bytes": "-1"}
RETENTION_KEYS = tuple(KEEP_EVERY_RECORD)
# Deleting records moves the log start; the disk comes back when a whole segment lies below it.
# Segments roll at 50 MiB or after 10 minutes, as Kafka Streams' repartition topics do, so a
# queue holds at most about one segment per partition beyond its unreceived messages.
QUEUE_SEGMENTS = {"segment.bytes": str(50 * 1024 * 1024), "segment.ms": str(10 * 60 * 1000)}


@dataclass
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    owner: str  # "queue X" / "system topic catalog": the object named in errors
    may_grow: bool  # compacted topics keep their partitions: moving keys breaks compaction
    # A queue topic grows only while unused: see apply.queue_in_use.
    grows_while_unused: bool = False


def topic_specs(catalog: Catalog) -> list[TopicSpec]:
    """The topics a catalog needs: the system topics first, then one per queue."""
    ns = catalog.namespace
    system: dict[str, SystemTopic] = {**load_system_topics(), **catalog.system_topics}
    specs = [
        TopicSpec(
            names.system_topic(ns, t.name),
            t.partitions,
            system_topic_config(t),
            f"system topic {t.name}",
            t.config["cleanup.policy"] == "delete",
        )
        for t in system.values()
    ]
    for q in catalog.queues.values():
        specs.append(
            TopicSpec(
                names.queue_topic(ns, q.name),
                q.partitions,
                queue_topic_config(q),
                f"queue {q.name}",
                True,
                grows_while_unused=True,
            )
        )
    return specs


def queue_topic_config(queue: Queue) -> dict[str, str]:
    """A queue topic's Kafka config. Neither time nor size deletes a record (G3: a message waits
    for its reader however long that takes); the worker's reclaimer deletes records below what
    the queue's readers still need (reclaim.py)."""
    return {
        "cleanup.policy": "delete",
        **KEEP_EVERY_RECORD,
        **QUEUE_SEGMENTS,
        "max.message.bytes": str(queue_limit(queue.max_message_bytes)),
    }


def system_topic_config(topic: SystemTopic) -> dict[str, str]:
    """A system topic's Kafka config as defined, with at least the max.message.bytes of
    core/topic_limits.py where records move to it: a dead letter or a routed message that its
    destination refuses would hold the partition it comes from."""
    config = dict(topic.config)
    need = system_topic_limit(topic.name)
    if need is not None and int(config.get("max.message.bytes", 0)) < need:
        config["max.message.bytes"] = str(need)
    return config
