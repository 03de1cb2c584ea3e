"""The worker's DMVs: sys.dm_broker_queue_monitors from the monitor table's changelog (so the view
needs no running worker), and sys.dm_broker_activated_tasks and sys.conversation_endpoints (kept in
memory) from the workers' HTTP API."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.activation.monitor import MonitorState
from kbroker.core.cluster import ClusterLike
from kbroker.core.rejected import Rejected, decoding, json_object
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import latest_records
from kbroker.worker.web.web_client import get_json


def iso_utc(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC, None as None: how the views write times."""
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def monitor_rows(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One row per queue monitor: queue, state, last_empty_rowset_time, last_activated_time,
    tasks_waiting, readers (activated readers running), backlog, ready_groups, owner worker, and
    how fresh the row is: `as_of`, when its counts were measured (the owner re-measures at least
    twice a tick, and writes the row each time), `age` in seconds when the view was asked for
    (the read's own time is the reader's, not the row's); and the
    owner's health when it wrote the row: `degraded` and `degraded_reasons`."""
    read_at = time.time()
    latest: dict[str, tuple[dict[str, Any], MonitorState]] = {}
    rejects = Rejects(cluster, namespace, "monitors view", record=False)  # logged: another client's record
    for msg in (latest_records(cluster, names.monitors_changelog_topic(namespace), timeout) or {}).values():
        try:
            queue, d = decoding(orjson.loads, msg.key()), json_object(msg.value())
            if not isinstance(queue, str):
                raise Rejected("the key is not a queue name")
            latest[queue] = d, decoding(MonitorState.from_dict, d)
        except Rejected as exc:
            rejects.reject(msg, exc.reason)
    rows = []
    for queue in sorted(latest):  # none before a worker ran
        d, st = latest[queue]
        dmv = st.dmv_row()
        as_of = d.get("counted", d.get("updated"))
        health = d.get("health") or {}
        rows.append(
            {
                **dmv,
                "last_empty_rowset_time": iso_utc(dmv["last_empty_rowset_time"]),
                "last_activated_time": iso_utc(dmv["last_activated_time"]),
                "readers": st.readers,
                "max_queue_readers": st.config.max_queue_readers,
                "activation": "ON" if st.config.enabled else "OFF",
                "kind": st.config.kind,
                "backlog": st.backlog,
                "ready_groups": st.ready_groups,
                "generation": st.generation,
                "worker": d.get("owner"),
                "updated": iso_utc(d.get("updated")),
                "as_of": iso_utc(as_of),
                "age": None if as_of is None else round(max(0.0, read_at - as_of), 3),
                "degraded": bool(health.get("degraded")),
                "degraded_reasons": health.get("reasons", []),
            }
        )
    return rows


def worker_conversations(
    url: str, namespace: str, timeout: float = 3.0, token_file: str | None = None
) -> list[dict[str, Any]] | None:
    """sys.conversation_endpoints from a running worker of `namespace` at `url` (its
    /conversations/ page), or None: none answers, it serves another namespace, or it is still
    reading the endpoints topic for the first time."""
    try:
        body = get_json(url, "/conversations/", timeout, token_file=token_file)
    except (OSError, ValueError):  # refused, timed out, an HTTP error status, not JSON
        return None
    if not isinstance(body, dict) or body.get("namespace") != namespace or not isinstance(body.get("rows"), list):
        return None
    rows: list[dict[str, Any]] = body["rows"]
    return rows
