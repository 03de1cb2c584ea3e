"""The worker's DMVs: sys.dm_broker_queue_monitors from the monitor table's changelog (so the view
needs no running worker), and sys.dm_broker_activated_tasks from the workers' HTTP API."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from .. import names
from ..config import KAFKA_LOG
from ..errors import BrokerUnavailableError
from .monitor import MonitorState


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def monitor_rows(bootstrap: str, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One row per queue monitor: queue, state, last_empty_rowset_time, last_activated_time,
    tasks_waiting, readers (activated readers running), backlog, ready_groups, owner worker."""
    topic = names.monitors_changelog_topic(namespace)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kbroker-views", "logger": KAFKA_LOG,
                  "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    latest: dict[str, dict] = {}
    try:
        meta = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return []  # no worker has run in this namespace yet
        todo = set()
        for p in meta.partitions:
            try:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            except KafkaException as exc:
                raise BrokerUnavailableError(f"cannot read {topic}: {exc.args[0].str()}") from None
            if high > low:
                todo.add(p)
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        todo.discard(m.partition())
                    continue
                key = orjson.loads(m.key())
                if m.value() is None:
                    latest.pop(key, None)
                else:
                    latest[key] = orjson.loads(m.value())
    finally:
        c.close()
    rows = []
    for queue in sorted(latest):
        d = latest[queue]
        st = MonitorState.from_dict(d)
        rows.append({
            "queue": queue, "state": st.state_desc, "last_empty_rowset_time": _iso(st.last_empty_rowset_time),
            "last_activated_time": _iso(st.last_activated_time), "tasks_waiting": st.tasks_waiting,
            "readers": st.readers, "max_queue_readers": st.config.max_queue_readers,
            "activation": "ON" if st.config.enabled else "OFF", "kind": st.config.kind,
            "backlog": st.backlog, "ready_groups": st.ready_groups, "generation": st.generation,
            "worker": d.get("owner"), "updated": _iso(d.get("updated")),
        })
    return rows
