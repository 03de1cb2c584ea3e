"""Links, the connections to other brokers (pure logic): one per destination, when each
may be opened, and when it is closed. A destination is another namespace, on this Kafka cluster
or another (`<bootstrap>/<namespace>`).

Seed 000's periodic tasks: every 2nd tick a link is opened to destinations that have
messages waiting and are not suppressed; a destination is suppressed for 15 s after a
disconnect and for 60 s after each failed connection attempt. Every 5th tick it closes connections
idle for 90 s. The first connection to a destination is opened as soon as a message needs it (not
at the next 2nd tick): only a connection that went wrong waits for its suppression and the tick.

The states and columns follow sys.dm_broker_connections (docs/sources.md, item 142).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPRESS_AFTER_DISCONNECT = 15.0
SUPPRESS_AFTER_FAILURE = 60.0
IDLE_CLOSE = 90.0
NEW, CONNECTING, CONNECTED, CLOSED = "NEW", "CONNECTING", "CONNECTED", "CLOSED"
HISTORY = 12


@dataclass
class Link:
    destination: str
    state: str = NEW
    connect_time: float | None = None
    last_activity: float = 0.0
    suppressed_until: float = 0.0
    failures: int = 0  # failed attempts in a row
    attempts: int = 0
    sends: int = 0
    acks: int = 0
    bytes_sent: int = 0
    last_error: str = ""
    tried: bool = False
    # The latest state changes, (epoch seconds, CONNECTING | CONNECTED | FAILED | DISCONNECTED |
    # IDLE_CLOSED): what `kbroker connections` shows of a link's recent history.
    history: list[tuple[float, str]] = field(default_factory=list)

    def note(self, now: float, event: str) -> None:
        self.history.append((now, event))
        del self.history[:-HISTORY]

    def row(self, now: float) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "state": self.state,
            "connect_time": self.connect_time,
            "last_activity_time": self.last_activity or None,
            "suppressed_for": max(0.0, self.suppressed_until - now),
            "failures": self.failures,
            "attempts": self.attempts,
            "total_sends": self.sends,
            "total_acks": self.acks,
            "total_bytes": self.bytes_sent,
            "last_error": self.last_error or None,
            "history": [[t, e] for t, e in self.history],
        }


class Links:
    """The connection table of one transmitter."""

    def __init__(self, idle_close: float = IDLE_CLOSE) -> None:
        self.links: dict[str, Link] = {}
        self.idle_close = idle_close

    def link(self, destination: str) -> Link:
        return self.links.setdefault(destination, Link(destination))

    def may_connect(self, destination: str, now: float, second_tick: bool) -> bool:
        """Whether to try connecting now: at once the first time, later only on a 2nd tick once
        the suppression has run out."""
        link = self.link(destination)
        if link.state in (CONNECTED, CONNECTING):
            return False
        if not link.tried:
            return True
        return second_tick and now >= link.suppressed_until

    def connecting(self, destination: str, now: float) -> None:
        link = self.link(destination)
        link.state, link.tried = CONNECTING, True
        link.attempts += 1
        link.note(now, "CONNECTING")

    def connected(self, destination: str, now: float) -> None:
        link = self.link(destination)
        link.state, link.connect_time, link.last_activity = CONNECTED, now, now
        link.failures, link.last_error = 0, ""
        link.note(now, "CONNECTED")

    def failed(self, destination: str, now: float, error: str) -> None:
        """A connection attempt failed: no new attempt for 60 s."""
        link = self.link(destination)
        link.state, link.last_error = CLOSED, error
        link.failures += 1
        link.suppressed_until = now + SUPPRESS_AFTER_FAILURE
        link.note(now, "FAILED")

    def disconnected(self, destination: str, now: float, error: str) -> None:
        """An open connection broke: no new attempt for 15 s."""
        link = self.link(destination)
        link.state, link.last_error = CLOSED, error
        link.suppressed_until = now + SUPPRESS_AFTER_DISCONNECT
        link.note(now, "DISCONNECTED")

    def active(self, destination: str, now: float, *, sends: int = 0, acks: int = 0, size: int = 0) -> None:
        link = self.link(destination)
        link.last_activity = now
        link.sends += sends
        link.acks += acks
        link.bytes_sent += size

    def idle(self, now: float, busy: set[str]) -> list[str]:
        """Connected destinations with nothing waiting and no activity for 90 s: to close."""
        return [
            d
            for d, link in self.links.items()
            if link.state == CONNECTED and d not in busy and now - link.last_activity >= self.idle_close
        ]

    def closed(self, destination: str, now: float | None = None) -> None:
        """Closed for being idle: the next message opens it again, with no suppression."""
        link = self.link(destination)
        link.state, link.tried = CLOSED, False
        link.note(link.last_activity + self.idle_close if now is None else now, "IDLE_CLOSED")

    def is_connected(self, destination: str) -> bool:
        return self.link(destination).state == CONNECTED

    def rows(self, now: float) -> list[dict[str, Any]]:
        return [link.row(now) for link in self.links.values()]
