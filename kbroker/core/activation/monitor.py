"""The queue monitor: when to launch an activated reader or send a QUEUE_ACTIVATION event (pure logic).

One monitor per queue, a state machine driven by `step(state, event, now) -> (state, actions)`.
The Faust adapter keeps the state in a table, feeds it events and `now`, and carries out the
actions; nothing here does I/O or reads a clock, so tests drive it with a fake one.

States (sys.dm_broker_queue_monitors.state):
  INACTIVE            no ready messages in the queue.
  NOTIFIED            a reader was launched (or, for external activation, a QUEUE_ACTIVATION event
                      sent) and no RECEIVE has run on the queue since.
  RECEIVES_OCCURRING  RECEIVEs are being issued on the queue.
The Books Online page for the DMV spells the last one RECEIVES_OCCURRING; Rusanu's article (seed
003) and DESIGN.md write RECEIVES_OCCURING. `state_desc` shows the documented DMV value;
`from_dict` accepts both.

Rules (seed 003 = Rusanu, "Understanding Queue Monitors"; seed 004 = BOL, "Understanding When
Activation Occurs"; numbers are the defaults):
 1. Re-check on every event: messages ready, RECEIVE issued, RECEIVE returned, rollback, reader
    exited, ALTER QUEUE, and the tick ("every few seconds", seed 004; the 5 s tick, seed 000).
    A message arriving is an event, so the first reader starts without waiting for a tick.
 2. Ready messages and no activated reader running -> launch one at once, go NOTIFIED (seed 004,
    "activation is necessary" (a)).
 3. NOTIFIED launches nothing more until some RECEIVE runs on the queue, from any session (seed
    003). A procedure that never RECEIVEs leaves the monitor NOTIFIED for good, with the one reader
    it got: the stub-procedure demo of seed 003. Every launch goes NOTIFIED, ramp-up ones too, and
    the guard outlives a drained queue: if the queue empties and refills before any RECEIVE, the
    monitor goes straight back to NOTIFIED instead of launching again.
 4. The first RECEIVE moves NOTIFIED -> RECEIVES_OCCURRING and starts the ramp-up timer. A RECEIVE
    that returns no rows records last_empty_rowset_time and restarts the timer. When the timer
    reaches `ramp_up` (5 s, hard-coded in SSB, configurable here) while messages are ready and no
    session is waiting in RECEIVE (tasks_waiting == 0), one more reader is launched (seed 003,
    seed 004 (b)). So readers are added at most one per 5 s: 1 -> 8 readers takes 35 s.
 5. Conversation-group aware (seed 004): only one reader can hold a conversation group, so there
    are never more activated readers than ready_groups + 1. A backlog on one conversation gets a
    second reader, which waits in RECEIVE, and no third.
 6. Never more readers than max_queue_readers (seed 004); max_queue_readers = 0 never activates,
    for either kind (the usual way to pause activation).
 7. ReaderExited counts a reader out. When the last one exits while messages are still ready and
    no RECEIVE came back empty since the last launch, a reader is launched again at once: the
    monitor keeps relaunching a procedure that handles one message and returns (reference item
    124). After an empty RECEIVE, only the ramp-up timer (rule 4) relaunches.
 8. No ready messages -> INACTIVE, whether or not readers are still running (seed 003: INACTIVE
    means nothing to receive). The readers stay counted.
 9. Activation OFF (or the queue disabled): no launches, state INACTIVE; ready counts are still
    tracked. Turning activation off, or on, or switching internal <-> external recycles the monitor:
    a fresh INACTIVE monitor with readers, tasks_waiting, timers and the NOTIFIED guard reset, and a
    new generation. Readers of an older generation are forgotten: their ReaderExited is ignored.
    So OFF then ON un-sticks a NOTIFIED monitor (seed 003) and a waiting backlog launches at once.
    Changing only the procedure or max_queue_readers does not recycle (seed 003: a changed
    procedure does not un-stick the monitor).
10. External activation (seed 004): NotifyExternal instead of LaunchReader, with the same rules,
    except that the broker cannot count external readers (rules 5 and 7 do not apply; readers stays
    0). While NOTIFIED it notifies again every `notify_timeout` seconds as long as messages are
    ready and no RECEIVE has run.

Counts come from the adapter: `backlog` = ready (unreceived) messages, `ready_groups` = distinct
conversation groups holding them, locked or not. MessagesReady carries both; the other events may
carry them too (None = unchanged), so a tick or a RECEIVE can refresh them without another event.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Literal

RAMP_UP_SECONDS = 5.0  # seed 003: "the timer threshold is 5 seconds"
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
_STATE_ALIASES = {"RECEIVES_OCCURING": MonitorStatus.RECEIVES_OCCURRING}  # seed 003's spelling


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


# ---- the state machine ----------------------------------------------------------------------


def step(state: MonitorState, event: Event, now: float) -> tuple[MonitorState, list[Action]]:
    """Apply one event at time `now`; return the new state and what to do."""
    if isinstance(event, QueueAltered):
        return _alter(state, event.config, now)
    s = _record(state, event, now)
    return _decide(s, now)


def new_monitor(queue: str, config: MonitorConfig) -> MonitorState:
    return MonitorState(queue=queue, config=config)


def _counts(s: MonitorState, backlog: int | None, groups: int | None) -> MonitorState:
    if backlog is not None:
        s = replace(s, backlog=max(0, backlog))
    if groups is not None:
        s = replace(s, ready_groups=max(0, groups))
    return s


def _record(s: MonitorState, ev: Event, now: float) -> MonitorState:
    """Bookkeeping of one event; the decision comes after, in _decide."""
    received = False
    if isinstance(ev, MessagesReady):
        s = _counts(s, ev.backlog, ev.ready_groups)
    elif isinstance(ev, (Rollback, Tick)):
        s = _counts(s, ev.backlog, ev.ready_groups)
    elif isinstance(ev, ReceiveIssued):
        s = _counts(s, ev.backlog, ev.ready_groups)
        s = replace(s, tasks_waiting=s.tasks_waiting + 1)
        received = True
    elif isinstance(ev, ReceiveReturned):
        s = _counts(s, ev.backlog, ev.ready_groups)
        s = replace(s, tasks_waiting=max(0, s.tasks_waiting - 1))
        received = True
    elif isinstance(ev, ReaderExited):
        if ev.generation is None or ev.generation == s.generation:
            s = replace(s, readers=max(0, s.readers - 1))
            if ev.in_receive:
                s = replace(s, tasks_waiting=max(0, s.tasks_waiting - 1))
    else:
        raise TypeError(f"not a monitor event: {ev!r}")

    if received:
        s = replace(s, last_receive_time=now, received_since_activation=True)
        if s.state is not MonitorStatus.RECEIVES_OCCURRING:
            s = replace(s, state=MonitorStatus.RECEIVES_OCCURRING, timer_started=now)
        if isinstance(ev, ReceiveReturned) and ev.empty:
            # Nothing to receive for this session: no point adding readers yet (rule 4).
            s = replace(s, last_empty_rowset_time=now, timer_started=now, empty_since_activation=True)
    return s


def _decide(s: MonitorState, now: float) -> tuple[MonitorState, list[Action]]:
    if not s.config.enabled or s.backlog == 0:
        return replace(s, state=MonitorStatus.INACTIVE, timer_started=None), []  # rules 8, 9

    if s.state is MonitorStatus.INACTIVE:
        if not s.received_since_activation:
            s = replace(s, state=MonitorStatus.NOTIFIED)  # still waiting for that RECEIVE (rule 3)
        elif s.config.internal and s.readers > 0:
            # Readers left over from earlier work will find the messages; only ramp-up adds more.
            return replace(s, state=MonitorStatus.RECEIVES_OCCURRING, timer_started=now), []
        else:
            return _activate(s, now)  # rule 2

    if s.state is MonitorStatus.NOTIFIED:
        c = s.config
        if (
            not c.internal
            and s.last_notified_time is not None
            and now - s.last_notified_time >= c.notify_timeout
        ):
            return _activate(s, now)  # rule 10: the external app had its time-out
        return s, []

    # RECEIVES_OCCURRING
    if s.config.internal and s.readers == 0 and not s.empty_since_activation:
        return _activate(s, now)  # rule 7
    if s.tasks_waiting == 0 and s.timer_started is not None and now - s.timer_started >= s.config.ramp_up:
        return _activate(s, now)  # rule 4
    return s, []


def _activate(s: MonitorState, now: float) -> tuple[MonitorState, list[Action]]:
    c = s.config
    if c.max_queue_readers <= 0:
        return s, []  # rule 6
    action: Action
    if c.internal:
        if s.readers >= min(c.max_queue_readers, s.ready_groups + 1):
            return s, []  # rules 5, 6
        action = LaunchReader(s.queue, c.procedure, s.generation)
        s = replace(s, readers=s.readers + 1, last_activated_time=now)
    else:
        action = NotifyExternal(s.queue, s.backlog, s.ready_groups)
        s = replace(s, last_activated_time=now, last_notified_time=now)
    s = replace(
        s,
        state=MonitorStatus.NOTIFIED,
        timer_started=None,
        received_since_activation=False,
        empty_since_activation=False,
    )
    return s, [action]


def _alter(s: MonitorState, config: MonitorConfig, now: float) -> tuple[MonitorState, list[Action]]:
    old = s.config
    if old.enabled == config.enabled and old.kind == config.kind:
        return _decide(replace(s, config=config), now)  # ALTER QUEUE is a re-check (rule 1)
    return recycle(s, config, now)


def recycle(s: MonitorState, config: MonitorConfig, now: float) -> tuple[MonitorState, list[Action]]:
    """Rule 9: a fresh monitor of a new generation (also what a worker taking the monitor over
    from a dead one starts from: the readers it counted are gone). The queue's counts are facts
    about the queue, so they stay."""
    fresh = MonitorState(
        queue=s.queue,
        config=config,
        generation=s.generation + 1,
        backlog=s.backlog,
        ready_groups=s.ready_groups,
    )
    fresh, actions = _decide(fresh, now)
    return fresh, [Recycled(s.queue, fresh.generation), *actions]
