"""The analytics job's control inputs and its outputs read back, decoded or rejected
(core/rejected.py): the receive progress snapshots (progress topic) and the timers the job
counts, the RECLASSIFY commands (control topic) and the result rows (analytics topic)."""

from __future__ import annotations

from typing import Any

from kbroker.core import names
from kbroker.core.analytics.analytics_model import Progress
from kbroker.core.dialogs.timers import timer_fields
from kbroker.core.rejected import Rejected, json_object, text_key


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json(raw: bytes | str | None) -> dict[str, Any]:
    return json_object(raw.encode(errors="surrogateescape") if isinstance(raw, str) else raw)


def progress_snapshot(raw: bytes | str | None) -> Progress:
    """A worker's receive progress of one queue (kafka/analytics/results.py writes it)."""
    snap = _json(raw)
    queue, at, parts = snap.get("queue"), snap.get("at"), snap.get("partitions")
    if not isinstance(queue, str) or not _number(at) or not isinstance(parts, list):
        raise Rejected("a progress snapshot needs 'queue', 'at' and 'partitions'")
    out = []
    for p in parts:
        if (
            not isinstance(p, dict)
            or not _int(p.get("partition"))
            or "committed" not in p
            or not (p["committed"] is None or _int(p["committed"]))
        ):
            raise Rejected("a progress partition needs 'partition' and 'committed' (integers)")
        completed = p.get("completed") or []
        if not isinstance(completed, list) or not all(_int(o) for o in completed):
            raise Rejected("a progress partition's 'completed' is a list of offsets")
        out.append((p["partition"], -1 if p["committed"] is None else p["committed"], frozenset(completed)))
    return Progress(queue, int(snap["at"]), tuple(out))


def armed_timer(namespace: str, raw: bytes | str | None) -> tuple[str, str, str] | None:
    """(queue, conversation_id, side) of a dialog timer the job counts; None for a lifetime."""
    value = timer_fields(namespace, _json(raw))
    if value["kind"] != "timer":
        return None
    queue = names.queue_of_topic(namespace, value["topic"])
    assert queue is not None  # timer_value checked it
    return queue, value["conversation_id"], value["side"]


def control_command(key: bytes | None, raw: bytes | None) -> tuple[str, dict[str, Any]]:
    """(dialog, command) of a control-topic record: a JSON object naming its 'command' and the
    dialog's 'conversation_id' and 'side' (the worker's /dialogs/ page sorts by them)."""
    dialog, command = text_key(key), json_object(raw)
    if not all(isinstance(command.get(f), str) for f in ("command", "conversation_id", "side")) or not isinstance(
        command.get("queue"), (str, type(None))
    ):
        raise Rejected("a control command needs 'command', 'conversation_id' and 'side'")
    return dialog, command


def analytics_row(key: bytes | None, raw: bytes | None) -> tuple[str, dict[str, Any]] | None:
    """('dialog' or 'queue', row) of an analytics-topic record; None for another key or a
    tombstone. The fields the views sort and compute with must have their types."""
    text = text_key(key)
    kind = text.partition("/")[0]
    if kind not in ("dialog", "queue") or raw is None:
        return None
    row = json_object(raw)
    if kind == "queue" and (not isinstance(row.get("queue"), str) or not _int(row.get("window_start"))):
        raise Rejected("a queue window needs 'queue' and 'window_start'")
    if kind == "dialog":
        if (
            not isinstance(row.get("conversation_id"), str)
            or not isinstance(row.get("side"), str)
            or not isinstance(row.get("queue"), (str, type(None)))
        ):
            raise Rejected("a dialog row needs 'conversation_id', 'side' and 'queue'")
        for f in ("oldest_unreceived", "oldest_age_s", "as_of"):
            if row.get(f) is not None and not _number(row[f]):
                raise Rejected(f"a dialog row's {f!r} is not a number")
    return kind, row
