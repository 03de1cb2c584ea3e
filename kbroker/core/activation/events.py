"""What goes into a queue monitor and what comes out: the events the adapter feeds `step`
(MessagesReady, ReceiveIssued, ReceiveReturned, Rollback, ReaderExited, QueueAltered, Tick) and
the actions it carries out (LaunchReader, NotifyExternal, Recycled). monitor_codec.py puts the
events on the wire by class name."""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.core.activation.monitor_state import MonitorConfig

# ---- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessagesReady:
    """The queue's ready counts changed (a message arrived, or the adapter recounted)."""

    backlog: int
    ready_groups: int


@dataclass(frozen=True)
class ReceiveIssued:
    """A session (any session) entered RECEIVE on the queue."""

    backlog: int | None = None
    ready_groups: int | None = None


@dataclass(frozen=True)
class ReceiveReturned:
    """A RECEIVE came back; `empty` = it returned no rows."""

    empty: bool
    backlog: int | None = None
    ready_groups: int | None = None


@dataclass(frozen=True)
class Rollback:
    """A transaction that had RECEIVEd rolled back; its messages are ready again."""

    backlog: int | None = None
    ready_groups: int | None = None


@dataclass(frozen=True)
class ReaderExited:
    """An activated reader returned. `generation` from its LaunchReader (None = current);
    `in_receive` if it died inside a RECEIVE that will never return."""

    generation: int | None = None
    in_receive: bool = False


@dataclass(frozen=True)
class QueueAltered:
    config: MonitorConfig


@dataclass(frozen=True)
class Tick:
    backlog: int | None = None
    ready_groups: int | None = None


Event = MessagesReady | ReceiveIssued | ReceiveReturned | Rollback | ReaderExited | QueueAltered | Tick


# ---- actions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchReader:
    """Run `procedure` as one more activated reader; pass `generation` back in ReaderExited."""

    queue: str
    procedure: str | None
    generation: int


@dataclass(frozen=True)
class NotifyExternal:
    """Publish a QUEUE_ACTIVATION event for the queue to the notification topic."""

    queue: str
    backlog: int
    ready_groups: int


@dataclass(frozen=True)
class Recycled:
    """The monitor was recycled: readers of older generations are no longer counted."""

    queue: str
    generation: int


Action = LaunchReader | NotifyExternal | Recycled
