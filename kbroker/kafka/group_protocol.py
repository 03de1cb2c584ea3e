"""Failover: how soon a killed process's partitions of a queue move to a live reader.

A dead member is noticed after its group's session time-out. With Kafka 4's consumer group
protocol (KIP-848, `group.protocol=consumer`) that time-out is the group's, set on the broker:
before a queue's consumer joins, kbroker sets its group's `consumer.session.timeout.ms` (2 s,
heartbeats every 0.5 s; the broker's group.consumer.min.session.timeout.ms must allow it, the
embedded broker's does). Measured with three competing readers and one kill -9 (bench/failover.py),
its partitions then sit idle 2.4-3.1 s instead of 11-12 s, and a busy loop per core took no
partition from a live reader: librdkafka heartbeats from a thread of its own, not the GIL's.

Where kbroker may not set that (a broker older than Kafka 4, a minimum above 2 s, no
ALTER_CONFIGS on the group: kbroker's own ACL roles give readers none) and the group does not
have it already (an operator's `kafka-configs.sh --alter --entity-type groups`), the queue's
consumer keeps the classic protocol with a 10 s session time-out (any broker's default minimum
is 6 s), and one warning per group says why and what to change.
KBROKER_GROUP_PROTOCOL=classic (or =consumer) skips the choice; KBROKER_QUEUE_SESSION_TIMEOUT_MS
sets the classic time-out (for measurements against the broker's minimum).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kbroker.core.cluster import Cluster
from kbroker.kafka import clients

log = logging.getLogger("kbroker.receiver")

SESSION_TIMEOUT_MS = 2_000  # the consumer protocol's, set as the queue group's config
HEARTBEAT_INTERVAL_MS = 500
CLASSIC_SESSION_TIMEOUT_MS = 10_000  # within every broker's default range (6 s to 30 min)
DEADLINE = 10.0  # s, for the group config's change

_chosen: dict[tuple[str, str], dict[str, Any]] = {}  # (bootstrap, group) -> settings, once per process
_lock = threading.Lock()


def classic_settings() -> dict[str, Any]:
    session = int(os.environ.get("KBROKER_QUEUE_SESSION_TIMEOUT_MS", CLASSIC_SESSION_TIMEOUT_MS))
    return {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session, "heartbeat.interval.ms": max(100, session // 10)}


def group_config() -> list[ConfigEntry]:
    """The queue group's configs for a fast failover under the consumer protocol."""
    return [ConfigEntry("consumer.session.timeout.ms", str(SESSION_TIMEOUT_MS),
                        incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("consumer.heartbeat.interval.ms", str(HEARTBEAT_INTERVAL_MS),
                        incremental_operation=AlterConfigOpType.SET)]


def set_group_config(cluster: Cluster, group: str) -> str | None:
    """Set the group's session time-out; None when done, else why not (the broker's words).
    Then, where the broker knows it (Kafka 4.3 and later), assignments without the 1 s batching
    of consumer.assignment.interval.ms: a failed attempt changes nothing else."""
    admin = clients.admin(cluster)
    why = _alter(admin, group, group_config())
    if why is None:
        _alter(admin, group, [ConfigEntry("consumer.assignment.interval.ms", "0",
                                          incremental_operation=AlterConfigOpType.SET)])
    return why


def _alter(admin: Any, group: str, entries: list[ConfigEntry]) -> str | None:
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    try:
        admin.incremental_alter_configs([resource], request_timeout=DEADLINE)[resource].result(DEADLINE + 5)
    except KafkaException as exc:
        return str(exc.args[0].str() if hasattr(exc.args[0], "str") else exc)
    except Exception as exc:  # noqa: BLE001 - a deadline or a refusal: any of them keeps the classic protocol
        return str(exc)
    return None


def group_session_ms(cluster: Cluster, group: str) -> int | None:
    """The group's consumer.session.timeout.ms as the broker reports it (set by an operator,
    say); None when it cannot be read."""
    admin = clients.admin(cluster)
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        entries = admin.describe_configs([resource], request_timeout=DEADLINE)[resource].result(DEADLINE + 5)
        return int(entries["consumer.session.timeout.ms"].value)
    except Exception:  # noqa: BLE001 - refused, unknown to the broker, or late: not known
        return None


def group_settings(cluster: Cluster, group: str) -> dict[str, Any]:
    """The group-membership settings of a queue's consumer in `group` (see the module docstring)."""
    forced = os.environ.get("KBROKER_GROUP_PROTOCOL", "").strip().lower()
    if forced == "classic":
        return classic_settings()
    if forced == "consumer":
        return {"group.protocol": "consumer"}
    key = (cluster.bootstrap, group)
    with _lock:
        if key in _chosen:
            return _chosen[key]
    why = set_group_config(cluster, group)
    if why is not None and (group_session_ms(cluster, group) or SESSION_TIMEOUT_MS + 1) <= SESSION_TIMEOUT_MS:
        why = None  # not ours to set, but set already (an operator's `kafka-configs --group`)
    if why is None:
        chosen: dict[str, Any] = {"group.protocol": "consumer"}
    else:
        chosen = classic_settings()
        log.warning("queue group %s keeps the classic group protocol: a killed reader's partitions wait "
                    "%d s for a new owner, not %d s. Setting its consumer.session.timeout.ms failed (%s); "
                    "on a Kafka 4 cluster whose group.consumer.min.session.timeout.ms is <= %d, grant "
                    "ALTER_CONFIGS on the group or set it there with kafka-configs.sh",
                    group, chosen["session.timeout.ms"] // 1000, SESSION_TIMEOUT_MS // 1000, why, SESSION_TIMEOUT_MS)
    with _lock:
        _chosen[key] = chosen
    return chosen
