"""The analytics topic (docs/analytics.md) read back: `kbroker dialogs`, and the follower the
worker's dashboard keeps current."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from kbroker.core import names
from kbroker.core.analytics.analytics_records import analytics_row
from kbroker.core.analytics.queue_analytics import dialog_row_at
from kbroker.core.cluster import ClusterLike
from kbroker.core.rejected import Rejected
from kbroker.kafka.clients import is_transient
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import latest_records, reading_consumer, topic_partitions

WINDOWS_KEPT = 60  # per queue, the newest windows the follower keeps (an hour at the default 60 s)


def dialog_rows(
    cluster: ClusterLike, namespace: str, klass: str | None = None, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Every dialog's latest classification (of class `klass` when given), sorted by queue and
    dialog; empty when no analytics job has written any. `oldest_age_s` is the age now."""
    rows = []
    now_ms = int(time.time() * 1000)
    rejects = Rejects(
        cluster, namespace, "dialogs view", record=False, scanned=True
    )  # the worker's 5th-tick scan records them
    topic = names.analytics_topic(namespace)
    for msg in (latest_records(cluster, topic, timeout) or {}).values():
        try:
            decoded = analytics_row(msg.key(), msg.value())
        except Rejected as exc:
            rejects.reject(msg, exc.reason)
            continue
        if decoded is None or decoded[0] != "dialog":
            continue
        row = decoded[1]
        if klass is None or row.get("class") == klass:
            rows.append(dialog_row_at(row, now_ms))
    return sorted(rows, key=lambda r: (r.get("queue") or "", r["conversation_id"], r["side"]))


class AnalyticsFollower:
    """Follows the analytics topic from its start, keeping each key's latest value: queue windows
    (the newest WINDOWS_KEPT per queue) and dialog classes. `poll()` reads what is new; call it
    from one thread; the readers (`queues`, `latest`, `dialogs`) may be called from any."""

    def __init__(self, cluster: ClusterLike, namespace: str):
        self.topic = names.analytics_topic(namespace)
        self.rejects = Rejects(cluster, namespace, "analytics follower", record=False, scanned=True)
        self._consumer = reading_consumer(cluster, names.reader_group(namespace), **{"enable.partition.eof": False})
        self._assigned = False
        self._lock = threading.Lock()
        self._windows: dict[str, dict[int, dict[str, Any]]] = {}
        self._dialogs: dict[bytes, dict[str, Any]] = {}

    def poll(self, timeout: float = 0.5) -> int:
        """Read what arrived (waiting up to `timeout`); returns how many records were read."""
        if not self._assigned:
            partitions = topic_partitions(self._consumer, self.topic, timeout)
            if partitions is None:
                return 0  # no analytics yet: `kbroker apply` creates the topic
            self._consumer.assign([TopicPartition(self.topic, p, 0) for p in partitions])
            self._assigned = True
        n = 0
        for msg in self._consumer.consume(1000, timeout):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF and not is_transient(err):
                    raise RuntimeError(f"reading {self.topic} failed: {err}")
                continue
            try:
                decoded = analytics_row(msg.key(), msg.value())
            except Rejected as exc:  # skipped and logged; the worker's 5th-tick scan records it
                self.rejects.reject(msg, exc.reason)
                continue
            self._take(msg.key(), decoded)
            n += 1
        return n

    def _take(self, key: bytes | None, decoded: tuple[str, dict[str, Any]] | None) -> None:
        if key is None:
            return
        with self._lock:
            if decoded is None:
                self._dialogs.pop(key, None)  # a dialog's tombstone (or a key the follower does not show)
            elif decoded[0] == "dialog":
                self._dialogs[key] = decoded[1]
            else:
                row = decoded[1]
                windows = self._windows.setdefault(row["queue"], {})
                windows[row["window_start"]] = row
                while len(windows) > WINDOWS_KEPT:
                    del windows[min(windows)]

    def queues(self) -> dict[str, list[dict[str, Any]]]:
        """queue -> its kept windows, oldest first."""
        with self._lock:
            return {q: [w[k] for k in sorted(w)] for q, w in self._windows.items()}

    def latest(self) -> dict[str, dict[str, Any]]:
        """queue -> its newest window."""
        with self._lock:
            return {q: w[max(w)] for q, w in self._windows.items() if w}

    def dialogs(self) -> list[dict[str, Any]]:
        """Every dialog's latest record, `oldest_age_s` the age now."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            return [dialog_row_at(row, now_ms) for row in self._dialogs.values()]

    def close(self) -> None:
        self._consumer.close()
