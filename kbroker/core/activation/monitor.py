"""The queue monitor: when to launch an activated reader or send a QUEUE_ACTIVATION event (pure logic).

One monitor per queue, a state machine driven by `step(state, event, now) -> (state, actions)`;
the adapter keeps the state, feeds it events and `now`, and carries out the actions. The states,
the ten rules (cited below by number) and where they come from are in docs/activation.md. The
state and its settings are monitor_state.py's, the events and actions events.py's; both are
importable from here.
"""

from __future__ import annotations

from dataclasses import replace

from kbroker.core.activation.events import (
    Action,
    Event,
    LaunchReader,
    MessagesReady,
    NotifyExternal,
    QueueAltered,
    ReaderExited,
    ReceiveIssued,
    ReceiveReturned,
    Recycled,
    Rollback,
    Tick,
)
from kbroker.core.activation.monitor_state import (
    DMV_STATE,
    NOTIFY_TIMEOUT_SECONDS,
    RAMP_UP_SECONDS,
    MonitorConfig,
    MonitorState,
    MonitorStatus,
)

__all__ = [
    "DMV_STATE",
    "NOTIFY_TIMEOUT_SECONDS",
    "RAMP_UP_SECONDS",
    "Action",
    "Event",
    "LaunchReader",
    "MessagesReady",
    "MonitorConfig",
    "MonitorState",
    "MonitorStatus",
    "NotifyExternal",
    "QueueAltered",
    "ReaderExited",
    "ReceiveIssued",
    "ReceiveReturned",
    "Recycled",
    "Rollback",
    "Tick",
    "new_monitor",
    "recycle",
    "step",
]


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
        if not c.internal and s.last_notified_time is not None and now - s.last_notified_time >= c.notify_timeout:
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
