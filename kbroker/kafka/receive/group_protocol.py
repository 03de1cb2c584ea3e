"""Which group protocol a queue's consumer joins with, and how soon a killed process's
partitions of the queue move to a live reader (the group's session time-out).

Queue consumers join with the classic protocol (cooperative-sticky) and a 2 s session time-out,
heartbeats every 0.2 s, where the brokers allow it (their group.min.session.timeout.ms is at most
2 s; the embedded broker's is 1 s), else 10 s (within any broker's default range, 6 s to 30 min)
with one warning saying what to change. Measured with three competing readers and one kill -9
under CPU load (bench/failover.py, 5 kills): a survivor holds the partitions 1.9-2.1 s after the
kill and the handling gap is 2.2-3.3 s (median 2.5), nothing lost or repeated.

Why not Kafka 4's consumer group protocol (KIP-848), which kbroker used before: its offset
commits are fenced by the member's epoch alone, and a commit at the current epoch is taken for
any partition (Kafka 4.4's ConsumerGroup.validateOffsetCommit checks partitions only for older
epochs). librdkafka 2.16 can leave a member holding partitions the coordinator has already given
to another: a member's first heartbeat after an assignment, sent while the topic's metadata is
still unknown, reports it owns nothing; if another member joined meanwhile the coordinator takes
that as the revocation done, hands the partitions over at once, and the first member then applies
the stale assignment, reads the partitions and commits them at its new epoch before the revocation
reaches it (seen in a trace of the 3-node cluster's coordinator-kill test: two processes read and
committed the same conversations, in 1 of 3 runs under load). The classic protocol's generation
is a barrier for the whole group: a partition moves only in a generation after its owner gave it
up, and a commit of an older generation is refused.
KBROKER_GROUP_PROTOCOL=consumer opts in to the consumer protocol anyway (its session is the
group's `consumer.session.timeout.ms`, set here to 2 s where kbroker may alter the group's
configs, else the classic protocol with a warning); KBROKER_QUEUE_SESSION_TIMEOUT_MS sets the
classic time-out and KBROKER_GROUP_PROTOCOL=classic keeps 10 s, neither asking the brokers.
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

SESSION_TIMEOUT_MS = 2_000  # the consumer protocol's (opt-in), set as the queue group's config
HEARTBEAT_INTERVAL_MS = 500
FAST_CLASSIC_SESSION_MS = 2_000  # where the brokers' group.min.session.timeout.ms allows it
CLASSIC_SESSION_TIMEOUT_MS = 10_000  # within every broker's default range (6 s to 30 min)
DEADLINE = 10.0  # s, for the group config's change and the brokers' minimum

_chosen: dict[tuple[str, str], dict[str, Any]] = {}  # (bootstrap, group) -> settings, once per process
_classic_session: dict[str, int] = {}  # bootstrap -> the classic session time-out chosen, once per process
_lock = threading.Lock()


def classic_settings(session_ms: int = CLASSIC_SESSION_TIMEOUT_MS) -> dict[str, Any]:
    session = int(os.environ.get("KBROKER_QUEUE_SESSION_TIMEOUT_MS", session_ms))
    return {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session,
        "heartbeat.interval.ms": max(100, session // 10),
    }


def _config_values(cluster: Cluster, resources: list[ConfigResource], name: str) -> list[int] | None:
    """The integer config `name` of each of `resources` as the brokers report it; None when any
    cannot be read (no DESCRIBE_CONFIGS, unknown to the broker, not a number, or late)."""
    admin = clients.admin(cluster)
    try:
        found = admin.describe_configs(resources, request_timeout=DEADLINE)
        return [int(f.result(DEADLINE + 5)[name].value) for f in found.values()]
    except Exception:  # noqa: BLE001 - any of them: not known
        return None


def brokers_min_session_ms(cluster: Cluster) -> int | None:
    """The brokers' group.min.session.timeout.ms (the highest any broker reports); None when it
    cannot be read (no DESCRIBE_CONFIGS on the cluster, say, or late)."""
    try:
        brokers = clients.broker_nodes(clients.admin(cluster), DEADLINE)
    except Exception:  # noqa: BLE001 - no broker answers: not known
        return None
    values = _config_values(
        cluster, [ConfigResource(ResourceType.BROKER, str(b.id)) for b in brokers], "group.min.session.timeout.ms"
    )
    return max(values) if values else None


def classic_session_ms(cluster: Cluster) -> int:
    """The classic session time-out for queue groups on `cluster`: FAST_CLASSIC_SESSION_MS where
    every broker allows it, else CLASSIC_SESSION_TIMEOUT_MS and one warning per process."""
    with _lock:
        if cluster.bootstrap in _classic_session:
            return _classic_session[cluster.bootstrap]
    least = brokers_min_session_ms(cluster)
    if least is not None and least <= FAST_CLASSIC_SESSION_MS:
        chosen = FAST_CLASSIC_SESSION_MS
    elif least is None:  # no DESCRIBE_CONFIGS on the cluster, as most readers have: not theirs to fix
        chosen = CLASSIC_SESSION_TIMEOUT_MS
        log.debug("queue groups keep a %d s session time-out: the brokers' minimum is unreadable here", chosen // 1000)
    else:
        chosen = CLASSIC_SESSION_TIMEOUT_MS
        log.warning(
            "queue groups keep a %d s session time-out: a killed reader's partitions wait that long for "
            "a new owner, not %d s. The brokers' group.min.session.timeout.ms is %s; set it to %d or less "
            "(or KBROKER_QUEUE_SESSION_TIMEOUT_MS within it)",
            chosen // 1000,
            FAST_CLASSIC_SESSION_MS // 1000,
            f"{least} ms",
            FAST_CLASSIC_SESSION_MS,
        )
    with _lock:
        _classic_session[cluster.bootstrap] = chosen
    return chosen


def group_config() -> list[ConfigEntry]:
    """The queue group's configs for a fast failover under the consumer protocol."""
    return [
        ConfigEntry(
            "consumer.session.timeout.ms", str(SESSION_TIMEOUT_MS), incremental_operation=AlterConfigOpType.SET
        ),
        ConfigEntry(
            "consumer.heartbeat.interval.ms", str(HEARTBEAT_INTERVAL_MS), incremental_operation=AlterConfigOpType.SET
        ),
    ]


def set_group_config(cluster: Cluster, group: str) -> str | None:
    """Set the group's session time-out; None when done, else why not (the broker's words).
    Then, where the broker knows it (Kafka 4.3 and later), assignments without the 1 s batching
    of consumer.assignment.interval.ms: a failed attempt changes nothing else."""
    admin = clients.admin(cluster)
    why = _alter(admin, group, group_config())
    if why is None:
        _alter(
            admin,
            group,
            [ConfigEntry("consumer.assignment.interval.ms", "0", incremental_operation=AlterConfigOpType.SET)],
        )
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
    values = _config_values(cluster, [ConfigResource(ResourceType.GROUP, group)], "consumer.session.timeout.ms")
    return values[0] if values else None


def group_settings(cluster: Cluster, group: str) -> dict[str, Any]:
    """The group-membership settings of a queue's consumer in `group` (see the module docstring)."""
    forced = os.environ.get("KBROKER_GROUP_PROTOCOL", "").strip().lower()
    if forced == "classic" or "KBROKER_QUEUE_SESSION_TIMEOUT_MS" in os.environ:
        return classic_settings()  # 10 s, or the time-out given: no broker asked
    if forced != "consumer":
        return classic_settings(classic_session_ms(cluster))
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
        chosen = classic_settings(classic_session_ms(cluster))
        log.warning(
            "queue group %s keeps the classic group protocol: setting its consumer.session.timeout.ms "
            "failed (%s); on a Kafka 4 cluster whose group.consumer.min.session.timeout.ms is <= %d, "
            "grant ALTER_CONFIGS on the group or set it there with kafka-configs.sh",
            group,
            why,
            SESSION_TIMEOUT_MS,
        )
    with _lock:
        _chosen[key] = chosen
    return chosen
