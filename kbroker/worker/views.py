"""The worker's DMVs: sys.dm_broker_queue_monitors from the monitor table's changelog (so the view
needs no running worker), and sys.dm_broker_activated_tasks from the workers' HTTP API."""

from __future__ import annotations

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
    tasks_waiting, readers (activated readers running), backlog, ready_groups, owner worker."""
    raw = latest_values(bootstrap, names.monitors_changelog_topic(namespace), timeout)
    latest = {orjson.loads(k): orjson.loads(v) for k, v in (raw or {}).items()}  # None: no worker ran yet
    rows = []
    for queue in sorted(latest):
        d = latest[queue]
        st = MonitorState.from_dict(d)
        dmv = st.dmv_row()
        rows.append({
            **dmv, "last_empty_rowset_time": _iso(dmv["last_empty_rowset_time"]),
            "last_activated_time": _iso(dmv["last_activated_time"]),
            "readers": st.readers, "max_queue_readers": st.config.max_queue_readers,
            "activation": "ON" if st.config.enabled else "OFF", "kind": st.config.kind,
            "backlog": st.backlog, "ready_groups": st.ready_groups, "generation": st.generation,
            "worker": d.get("owner"), "updated": _iso(d.get("updated")),
        })
    return rows
