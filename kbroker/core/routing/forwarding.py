"""The forwarder's memory (pure logic): messages for services this namespace does not host, held
until they are passed on toward their route.

Service Broker forwards only when the endpoint says MESSAGE_FORWARDING = ENABLED, holds forwarded
messages in memory only, within MESSAGE_FORWARD_SIZE megabytes (a message that would pass the cap
is dropped), and every 5th tick deletes those it could not pass on within 60 s of arrival
(reference items 138-141). Dropping loses nothing: the sender keeps every message until the far
side acknowledges it, and sends it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORWARD_STALE_AFTER = 60.0  # docs/sources.md#periodic-tasks: forwarded messages not sent on within 60 s are deleted
MB = 1024 * 1024


@dataclass
class Forwarded:
    """One message being forwarded (a row of sys.dm_broker_forwarded_messages)."""

    message_id: str
    conversation_id: str
    is_initiator: bool  # sent by the initiator
    to_service: str
    from_service: str
    from_broker: str
    destination: str  # the next hop, `<bootstrap>/<namespace>`
    sequence: int
    size: int
    arrived: float
    record: Any = field(default=None, repr=False, compare=False)

    def row(self, now: float) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "is_initiator": self.is_initiator,
            "to_service_name": self.to_service,
            "from_service_name": self.from_service,
            "from_broker_instance": self.from_broker,
            "adjacent_broker_address": self.destination,
            "message_sequence_number": self.sequence,
            "message_id": self.message_id,
            "size": self.size,
            "time_consumed": round(now - self.arrived, 3),
            "time_to_live": round(max(0.0, self.arrived + FORWARD_STALE_AFTER - now), 3),
        }


class ForwardQueue:
    """What one forwarder holds, bounded by `limit_bytes`."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.held: dict[str, Forwarded] = {}  # message id -> message, in arrival order
        self.bytes = 0
        self.dropped_full = self.dropped_stale = self.sent = 0

    def add(self, m: Forwarded) -> bool:
        """Hold `m` to pass on; False (dropped) when it would pass the size cap. A copy of a
        message already held is not held twice."""
        if m.message_id in self.held:
            return True
        if self.bytes + m.size > self.limit:
            self.dropped_full += 1
            return False
        self.held[m.message_id] = m
        self.bytes += m.size
        return True

    def for_destination(self, destination: str) -> list[Forwarded]:
        return [m for m in self.held.values() if m.destination == destination]

    def destinations(self) -> set[str]:
        return {m.destination for m in self.held.values()}

    def passed_on(self, m: Forwarded) -> None:
        if self.held.pop(m.message_id, None) is not None:
            self.bytes -= m.size
            self.sent += 1

    def sweep(self, now: float, stale_after: float = FORWARD_STALE_AFTER) -> list[Forwarded]:
        """The 5th tick: delete what was not passed on within `stale_after` of arriving."""
        stale = [m for m in self.held.values() if now - m.arrived >= stale_after]
        for m in stale:
            del self.held[m.message_id]
            self.bytes -= m.size
        self.dropped_stale += len(stale)
        return stale

    def rows(self, now: float, limit: int = 200) -> list[dict[str, Any]]:
        return [m.row(now) for m in list(self.held.values())[:limit]]
