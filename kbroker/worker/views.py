"""The worker's DMVs: sys.dm_broker_queue_monitors from the monitor table's changelog (so the view
needs no running worker), and sys.dm_broker_activated_tasks from the workers' HTTP API."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.monitor import MonitorState
from kbroker.kafka.reader import latest_values


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def monitor_rows(bootstrap: str, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One row per queue monitor: queue, state, last_empty_rowset_time, last_activated_time,
    tasks_waiting, readers (activated readers running), backlog, ready_groups, owner worker, and
    how fresh the row is: `as_of`, when its counts were measured (the owner re-measures at least
    once a tick, and writes the row at least once a tick), `age` in seconds at reading time; and the
    owner's health when it wrote the row: `degraded` and `degraded_reasons`."""
    raw = latest_values(bootstrap, names.monitors_changelog_topic(namespace), timeout)
    latest = {orjson.loads(k): orjson.loads(v) for k, v in (raw or {}).items()}  # None: no worker ran yet
    rows = []
    read_at = time.time()
    for queue in sorted(latest):
        d = latest[queue]
        st = MonitorState.from_dict(d)
        dmv = st.dmv_row()
        as_of = d.get("counted", d.get("updated"))
        health = d.get("health") or {}
        rows.append({
            **dmv, "last_empty_rowset_time": _iso(dmv["last_empty_rowset_time"]),
            "last_activated_time": _iso(dmv["last_activated_time"]),
            "readers": st.readers, "max_queue_readers": st.config.max_queue_readers,
            "activation": "ON" if st.config.enabled else "OFF", "kind": st.config.kind,
            "backlog": st.backlog, "ready_groups": st.ready_groups, "generation": st.generation,
            "worker": d.get("owner"), "updated": _iso(d.get("updated")),
            "as_of": _iso(as_of), "age": None if as_of is None else round(max(0.0, read_at - as_of), 3),
            "degraded": bool(health.get("degraded")), "degraded_reasons": health.get("reasons", []),
        })
    return rows
