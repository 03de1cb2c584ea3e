"""Publish/subscribe (the SQL Server transport's subscription routing table) as Kafka records.
Pure: no I/O.

The table is shared by every endpoint of a namespace: the compacted topic
`kbroker.<ns>.tsubscriptions`, one record per (endpoint, event type):

    key     ["<endpoint>", "<event type>"] as JSON (one key per subscription, so compaction keeps
            the last word on each)
    value   {"endpoint": ..., "queue": <the address copies go to>, "type": ...} as JSON; a
            tombstone (null value) is an unsubscribe

A publish writes one copy of the event to the queue of every endpoint subscribed to any type the
event carries in `NServiceBus.EnclosedMessageTypes` (its type, then its base types and
interfaces, as NServiceBus writes them), once per endpoint however many of its types match: a
subscriber to a base type receives the derived events.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from kbroker.core import names
from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.records import Record
from kbroker.core.transport.endpoint import QUEUE_RE

STALENESS = 5.0  # seconds an instance's copy of the table may lag behind it (the transport's cache)
MAX_TYPE = 512  # characters of an event type's name
MESSAGE_INTENT = "NServiceBus.MessageIntent"


def subscriptions_topic(ns: str) -> str:
    """The namespace's subscription table: `kbroker.<ns>.tsubscriptions`."""
    return f"{names.prefix(ns)}tsubscriptions"


def type_name(text: str) -> str:
    """An event type's name as subscriptions match it: the full type name, without the assembly
    and version an assembly-qualified name adds (`Sales.OrderPlaced, Sales, Version=1.0.0.0`
    is `Sales.OrderPlaced`). ValueError for an empty name, control characters or over MAX_TYPE."""
    if not isinstance(text, str):
        raise ValueError(f"an event type must be text, not {text!r}")
    name = text.split(",", 1)[0].strip()
    if not name:
        raise ValueError(f"event type {text!r} is empty")
    if len(name) > MAX_TYPE or any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(f"event type {name[:40]!r} must be at most {MAX_TYPE} printable characters")
    return name


def enclosed_types(value: str) -> list[str]:
    """The types an `NServiceBus.EnclosedMessageTypes` header names (separated by ';'), as
    type names, in order, each once; ValueError when one is not a type name."""
    out: list[str] = []
    for part in value.split(";"):
        if part.strip():
            name = type_name(part)
            if name not in out:
                out.append(name)
    if not out:
        raise ValueError("EnclosedMessageTypes names no type")
    return out


@dataclass(frozen=True)
class Subscription:
    """Endpoint `endpoint` receives events of `type` (and types derived from it) at `queue`."""

    endpoint: str
    queue: str
    type: str

    def as_dict(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "queue": self.queue, "type": self.type}


def subscription_key(endpoint: str, event_type: str) -> bytes:
    return orjson.dumps([endpoint, event_type])


def subscribe_record(topic: str, sub: Subscription) -> Record:
    """The record that subscribes `sub.endpoint` to `sub.type`."""
    return (topic, subscription_key(sub.endpoint, sub.type), orjson.dumps(sub.as_dict()), None)


def unsubscribe_record(topic: str, endpoint: str, event_type: str) -> Record:
    """The tombstone that ends the subscription."""
    return (topic, subscription_key(endpoint, event_type), None, None)


def from_subscription(key: bytes | None, value: bytes | None) -> tuple[tuple[str, str], Subscription | None]:
    """((endpoint, type), the subscription or None for an unsubscribe) of a record; MalformedRecord
    naming what is wrong (any client that may write the topic may write anything)."""
    try:
        endpoint, event_type = _pair(orjson.loads(key or b""))
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise MalformedRecord('a subscription key is ["<endpoint>", "<event type>"] as JSON') from None
    if not isinstance(endpoint, str) or not QUEUE_RE.fullmatch(endpoint):
        raise MalformedRecord(f"subscription endpoint {endpoint!r} is not an endpoint name")
    try:
        if not isinstance(event_type, str) or type_name(event_type) != event_type:
            raise ValueError(f"{event_type!r} is not a type name")
    except ValueError as exc:
        raise MalformedRecord(f"subscription type: {exc}") from None
    if key != subscription_key(endpoint, event_type):  # another spelling would be another compaction slot
        raise MalformedRecord("a subscription key is not in its canonical form")
    if value is None:
        return (endpoint, event_type), None
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise MalformedRecord("a subscription's value is not JSON") from None
    if not isinstance(d, dict) or d.get("endpoint") != endpoint or d.get("type") != event_type:
        raise MalformedRecord("a subscription's value does not match its key")
    queue = d.get("queue")
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue):
        raise MalformedRecord(f"subscription queue {queue!r} is not a queue name")
    return (endpoint, event_type), Subscription(endpoint, queue, event_type)


def _pair(loaded: object) -> tuple[object, object]:
    if not isinstance(loaded, list) or len(loaded) != 2:
        raise ValueError("not a pair")
    return loaded[0], loaded[1]


class SubscriptionTable:
    """An instance's copy of the table: the last record of each (endpoint, type) wins."""

    def __init__(self) -> None:
        self._subs: dict[tuple[str, str], Subscription] = {}
        self._by_type: dict[str, dict[str, Subscription]] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def apply(self, key: tuple[str, str], sub: Subscription | None) -> None:
        old = self._subs.pop(key, None)
        if old is not None:
            self._by_type[old.type].pop(old.endpoint, None)
            if not self._by_type[old.type]:
                del self._by_type[old.type]
        if sub is not None:
            self._subs[key] = sub
            self._by_type.setdefault(sub.type, {})[sub.endpoint] = sub

    def subscribers(self, types: Iterable[str]) -> list[Subscription]:
        """One subscription per endpoint subscribed to any of `types` (the first type it matches
        decides its queue), by endpoint name."""
        found: dict[str, Subscription] = {}
        for t in types:
            for endpoint, sub in self._by_type.get(t, {}).items():
                found.setdefault(endpoint, sub)
        return [found[e] for e in sorted(found)]

    def all(self) -> list[Subscription]:
        """Every subscription, by type then endpoint."""
        return sorted(self._subs.values(), key=lambda s: (s.type, s.endpoint))
