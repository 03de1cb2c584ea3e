"""A queue monitor's state and the settings it obeys: MonitorConfig (from the queue's catalog
entry), MonitorStatus (sys.dm_broker_queue_monitors.state) and MonitorState, with their JSON for
the monitor table (see docs/activation.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

RAMP_UP_SECONDS = 5.0  # docs/sources.md#queue-monitors: "the timer threshold is 5 seconds"
NOTIFY_TIMEOUT_SECONDS = 60.0  # the catalog's Activation.notify_timeout default


class MonitorStatus(str, enum.Enum):
    INACTIVE = "INACTIVE"
    NOTIFIED = "NOTIFIED"
    RECEIVES_OCCURRING = "RECEIVES_OCCURRING"


# What sys.dm_broker_queue_monitors.state shows. One place to change if the engine's spelling
# turns out to differ from its documentation.
DMV_STATE = {
    MonitorStatus.INACTIVE: "INACTIVE",
    MonitorStatus.NOTIFIED: "NOTIFIED",
    MonitorStatus.RECEIVES_OCCURRING: "RECEIVES_OCCURRING",
}
_STATE_ALIASES = {"RECEIVES_OCCURING": MonitorStatus.RECEIVES_OCCURRING}  # docs/sources.md#queue-monitors


@dataclass(frozen=True)
class MonitorConfig:
    """The activation settings the monitor obeys (from the queue's catalog entry)."""

    enabled: bool = True  # ACTIVATION STATUS = ON and the queue itself enabled
    kind: Literal["internal", "external"] = "internal"
    procedure: str | None = None  # "module:function" launched per reader (internal)
    max_queue_readers: int = 1
    ramp_up: float = RAMP_UP_SECONDS
    notify_timeout: float = NOTIFY_TIMEOUT_SECONDS  # external only

    @property
    def internal(self) -> bool:
        return self.kind == "internal"

    @classmethod
    def from_activation(
        cls, activation: Any, *, queue_enabled: bool = True, ramp_up: float = RAMP_UP_SECONDS
    ) -> MonitorConfig:
        """From a catalog `Activation` (or None: no activation clause, so never activates)."""
        if activation is None:
            return cls(enabled=False, ramp_up=ramp_up)
        return cls(
            enabled=queue_enabled and activation.status == "ON",
            kind=activation.kind,
            procedure=activation.procedure,
            max_queue_readers=activation.max_queue_readers,
            ramp_up=ramp_up,
            notify_timeout=activation.notify_timeout,
        )

    @classmethod
    def from_queue(cls, queue: Any, *, ramp_up: float = RAMP_UP_SECONDS) -> MonitorConfig:
        """From a catalog `Queue`: a disabled queue (STATUS = OFF) activates nothing."""
        return cls.from_activation(queue.activation, queue_enabled=queue.status == "ON", ramp_up=ramp_up)

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "kind": self.kind,
            "procedure": self.procedure,
            "max_queue_readers": self.max_queue_readers,
            "ramp_up": self.ramp_up,
            "notify_timeout": self.notify_timeout,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonitorConfig:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class MonitorState:
    queue: str
    config: MonitorConfig = MonitorConfig()
    state: MonitorStatus = MonitorStatus.INACTIVE
    generation: int = 0  # bumped by each recycle; readers carry it so stale exits are ignored
    readers: int = 0  # activated readers of this generation still running
    tasks_waiting: int = 0  # sessions inside a RECEIVE on the queue (activated or not)
    backlog: int = 0  # ready messages
    ready_groups: int = 0  # conversation groups holding them
    last_empty_rowset_time: float | None = None
    last_activated_time: float | None = None  # last launch or notification
    last_receive_time: float | None = None
    last_notified_time: float | None = None  # external: last QUEUE_ACTIVATION event
    timer_started: float | None = None  # ramp-up timer base; runs only in RECEIVES_OCCURRING
    received_since_activation: bool = True  # False = NOTIFIED guard armed (rule 3)
    empty_since_activation: bool = False  # an empty RECEIVE since the last launch (rule 7)

    @property
    def state_desc(self) -> str:
        return DMV_STATE[self.state]

    def dmv_row(self) -> dict[str, Any]:
        """The sys.dm_broker_queue_monitors columns (times as the adapter's clock values)."""
        return {
            "queue": self.queue,
            "state": self.state_desc,
            "last_empty_rowset_time": self.last_empty_rowset_time,
            "last_activated_time": self.last_activated_time,
            "tasks_waiting": self.tasks_waiting,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for the monitor table."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["config"] = self.config.to_dict()
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonitorState:
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["config"] = MonitorConfig.from_dict(d.get("config", {}))
        raw = d.get("state", "INACTIVE")
        kw["state"] = _STATE_ALIASES.get(raw) or MonitorStatus(raw)
        return cls(**kw)
