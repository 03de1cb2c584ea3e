"""QUEUE_ACTIVATION events, as the worker publishes them on `kbroker.<ns>.events` (key: the queue):

    {"event": "QUEUE_ACTIVATION", "queue": "<queue>", "namespace": "<ns>",
     "backlog": <int>, "ready_groups": <int>, "time": <epoch ms>}

Other events share the topic (QUEUE_DISABLED, QUEUE_ENABLED, ...); `parse` returns None for them
and for anything unreadable, so one bad record never stops the activator.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

QUEUE_ACTIVATION = "QUEUE_ACTIVATION"


@dataclass(frozen=True)
class Notification:
    queue: str
    namespace: str | None
    backlog: int
    ready_groups: int
    time: float | None  # seconds since the epoch (the event carries milliseconds); None if absent


def parse(key: bytes | None, value: bytes | None) -> Notification | None:
    if not value:
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("event") != QUEUE_ACTIVATION:
        return None
    queue = doc.get("queue")
    if not isinstance(queue, str) and key:
        queue = key.decode("utf-8", "replace")  # the key is the queue too
    if not isinstance(queue, str) or not queue:
        return None

    def count(field: str) -> int:
        v = doc.get(field)
        # A missing count is not "no work": the event itself says activation is needed.
        return v if isinstance(v, int) and not isinstance(v, bool) else -1

    t = doc.get("time")
    ns = doc.get("namespace")
    return Notification(
        queue=queue,
        namespace=ns if isinstance(ns, str) else None,
        backlog=count("backlog"),
        ready_groups=count("ready_groups"),
        time=t / 1000.0 if isinstance(t, (int, float)) and not isinstance(t, bool) else None,
    )
