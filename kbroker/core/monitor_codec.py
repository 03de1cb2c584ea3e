"""Monitor events on the wire: JSON with the event's class name, so every worker and the CLI
put the same bytes on the monitor-events topic. Pure."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import orjson

from kbroker.core.monitor import (
    Event,
    MessagesReady,
    MonitorConfig,
    QueueAltered,
    ReaderExited,
    ReceiveIssued,
    ReceiveReturned,
    Rollback,
    Tick,
)

_KINDS = {cls.__name__: cls for cls in (MessagesReady, ReceiveIssued, ReceiveReturned, Rollback, ReaderExited,
                                        QueueAltered, Tick)}


class BadEvent(ValueError):
    """A monitor-events record that is not one of the events (logged and skipped)."""


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


def decode(raw: bytes) -> tuple[Event, str | None]:
    """(event, worker it came from or None)."""
    try:
        body = orjson.loads(raw)
        cls = _KINDS[body.pop("event")]
        worker = body.pop("worker", None)
        if cls is QueueAltered:
            return QueueAltered(MonitorConfig.from_dict(body["config"])), worker
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in body.items() if k in names}), worker
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadEvent(f"not a monitor event: {raw[:80]!r} ({exc})") from None
