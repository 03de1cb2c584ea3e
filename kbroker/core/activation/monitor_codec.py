"""Monitor events on the wire: JSON with the event's class name, so every worker and the CLI
put the same bytes on the monitor-events topic. Pure."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import orjson

from kbroker.core.activation.events import (
    Event,
    MessagesReady,
    QueueAltered,
    ReaderExited,
    ReceiveIssued,
    ReceiveReturned,
    Rollback,
    Tick,
)
from kbroker.core.activation.monitor_state import MonitorConfig
from kbroker.core.rejected import Rejected, json_object

_KINDS = {
    cls.__name__: cls
    for cls in (MessagesReady, ReceiveIssued, ReceiveReturned, Rollback, ReaderExited, QueueAltered, Tick)
}


class BadEvent(Rejected):
    """A monitor-events record that is not one of the events (set aside and skipped)."""


# Each event field's JSON type: a record anyone may have written must not carry a string where
# the monitor counts (the step would raise on it, every time the event is replayed).
_INT, _OPT_INT, _BOOL = (int,), (int, type(None)), (bool,)
_FIELD_TYPES = {
    "backlog": _OPT_INT,
    "ready_groups": _OPT_INT,
    "generation": _OPT_INT,
    "empty": _BOOL,
    "in_receive": _BOOL,
}
_CONFIG_TYPES = {
    "enabled": _BOOL,
    "kind": (str,),
    "procedure": (str, type(None)),
    "max_queue_readers": _INT,
    "ramp_up": (int, float),
    "notify_timeout": (int, float),
}


def _typed(body: dict[str, Any], types: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    for k, v in body.items():
        want = types.get(k)
        if want is not None and (not isinstance(v, want) or (isinstance(v, bool) and bool not in want)):
            raise BadEvent(f"field {k!r} is {type(v).__name__}, not {' or '.join(t.__name__ for t in want)}")
    return body


def encode(event: Event, worker: str | None = None) -> bytes:
    """`worker`: the worker whose activated reader caused the event (None: seen from outside)."""
    body: dict[str, Any] = {"event": type(event).__name__}
    if worker is not None:
        body["worker"] = worker
    if isinstance(event, QueueAltered):
        body["config"] = event.config.to_dict()
    else:
        body.update(asdict(event))
    return orjson.dumps(body)


def decode(raw: bytes | None) -> tuple[Event, str | None]:
    """(event, worker it came from or None); BadEvent for anything else."""
    try:
        body = json_object(raw)
        cls = _KINDS.get(str(body.pop("event", None)))
        if cls is None:
            raise BadEvent("no known 'event'")
        worker = body.pop("worker", None)
        if not isinstance(worker, (str, type(None))):
            raise BadEvent("'worker' is not a string")
        if cls is QueueAltered:
            config = body.get("config")
            if not isinstance(config, dict) or config.get("kind", "internal") not in ("internal", "external"):
                raise BadEvent("'config' is not a monitor config")
            return QueueAltered(MonitorConfig.from_dict(_typed(config, _CONFIG_TYPES))), worker
        names = {f.name for f in fields(cls)}
        return cls(**_typed({k: v for k, v in body.items() if k in names}, _FIELD_TYPES)), worker
    except Rejected as exc:
        raise BadEvent(f"not a monitor event: {exc.reason}") from None
    except TypeError as exc:  # a required field missing (MessagesReady's counts)
        raise BadEvent(f"not a monitor event: {exc}") from None


def decode_tick_request(raw: bytes | None) -> tuple[str, float]:
    """A worker's tick request: (its id, its clock); Rejected for anything else."""
    body = json_object(raw)
    worker, now = body.get("worker"), body.get("now")
    if not isinstance(worker, str) or not isinstance(now, (int, float)) or isinstance(now, bool):
        raise Rejected("not a tick request: needs 'worker' (text) and 'now' (a number)")
    return worker, float(now)
