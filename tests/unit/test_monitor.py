"""The queue monitor state machine, driven with a fake clock (no Kafka)."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.activation.monitor import (
    LaunchReader,
    MessagesReady,
    MonitorConfig,
    MonitorState,
    MonitorStatus,
    NotifyExternal,
    QueueAltered,
    ReaderExited,
    ReceiveIssued,
    ReceiveReturned,
    Recycled,
    Rollback,
    Tick,
    new_monitor,
    step,
)

INACTIVE, NOTIFIED, RECEIVING = (
    MonitorStatus.INACTIVE,
    MonitorStatus.NOTIFIED,
    MonitorStatus.RECEIVES_OCCURRING,
)
PROC = "app.handlers:process"


class Monitor:
    """A monitor plus a fake clock; records every action."""

    def __init__(self, **config):
        config.setdefault("procedure", PROC)
        config.setdefault("max_queue_readers", 5)
        self.s = new_monitor("q", MonitorConfig(**config))
        self.now = 1000.0
        self.actions: list = []

    def at(self, t):
        self.now = 1000.0 + t
        return self

    def __call__(self, event):
        self.s, out = step(self.s, event, self.now)
        self.actions.extend(out)
        return out

    def launches(self):
        return [a for a in self.actions if isinstance(a, LaunchReader)]

    def notifies(self):
        return [a for a in self.actions if isinstance(a, NotifyExternal)]


def launched(out):
    return [a for a in out if isinstance(a, LaunchReader)]


# ---- rule 2: first message, no reader -> launch at once ------------------------------------


def test_first_message_launches_at_once_without_a_tick():
    m = Monitor()
    assert m.s.state is INACTIVE and m.s.state_desc == "INACTIVE"
    out = m(MessagesReady(backlog=1, ready_groups=1))
    assert out == [LaunchReader("q", PROC, 0)]
    assert m.s.state is NOTIFIED and m.s.readers == 1
    assert m.s.last_activated_time == m.now


def test_no_messages_no_launch():
    m = Monitor()
    assert m(MessagesReady(0, 0)) == []
    assert m(Tick()) == []
    assert m.s.state is INACTIVE


# ---- rule 3: NOTIFIED waits for a RECEIVE (seed 003 stub) -----------------------------------


def test_stub_that_never_receives_stays_notified_forever_with_one_reader():
    m = Monitor()
    m(MessagesReady(1, 1))
    for i in range(1, 200):  # 1000 s of ticks and more arrivals
        m.at(i * 5)
        m(MessagesReady(1 + i, 1 + i))
        m(Tick())
    assert m.s.state is NOTIFIED
    assert len(m.launches()) == 1 and m.s.readers == 1


def test_stub_that_returns_at_once_is_not_relaunched():
    m = Monitor()
    m(MessagesReady(3, 3))
    m.at(0.1)(ReaderExited(generation=0))  # the stub: no RECEIVE, just returns
    assert m.s.readers == 0 and m.s.state is NOTIFIED
    m.at(60)(Tick())
    m.at(61)(MessagesReady(4, 4))
    assert len(m.launches()) == 1 and m.s.state is NOTIFIED


def test_any_receive_unsticks_notified():
    m = Monitor()
    m(MessagesReady(2, 2))
    m.at(0.2)(ReceiveIssued())  # from any session
    assert m.s.state is RECEIVING and m.s.state_desc == "RECEIVES_OCCURRING"
    assert m.s.last_receive_time == m.now and m.s.tasks_waiting == 1


def test_guard_survives_a_drained_queue():
    # Launched, then the queue drains without any RECEIVE (e.g. END CONVERSATION WITH CLEANUP):
    # new messages must not launch a second reader before the first one RECEIVEs.
    m = Monitor()
    m(MessagesReady(1, 1))
    m.at(1)(MessagesReady(0, 0))
    assert m.s.state is INACTIVE
    m.at(2)(MessagesReady(1, 1))
    assert m.s.state is NOTIFIED and len(m.launches()) == 1


# ---- rule 4: ramp-up timer ------------------------------------------------------------------


def busy_queue(groups=10, **config):
    """A monitor whose first reader is receiving from a busy queue at t=0."""
    m = Monitor(**config)
    m(MessagesReady(100, groups))
    m(ReceiveIssued())
    m(ReceiveReturned(empty=False))
    return m


def test_ramp_up_after_five_seconds_without_an_empty_receive():
    m = busy_queue()
    assert m.s.state is RECEIVING and m.s.timer_started == m.now
    assert launched(m.at(4.9)(Tick())) == []
    out = m.at(5.0)(Tick())
    assert out == [LaunchReader("q", PROC, 0)] and m.s.readers == 2
    assert m.s.state is NOTIFIED  # every launch arms the guard


def test_ramp_up_launches_one_per_threshold():
    # Readers RECEIVE every 100 ms, right after each tick. Each launch arms the NOTIFIED guard and
    # the next RECEIVE restarts the timer, so launches come one per 5 s.
    m = busy_queue(max_queue_readers=8)
    launch_times = []
    for tenth in range(1, 1000):
        m.at(tenth / 10)
        if launched(m(Tick())):
            launch_times.append(tenth / 10)
        m(ReceiveIssued())
        m(ReceiveReturned(empty=False))
    assert m.s.readers == 8 and len(launch_times) == 7
    assert launch_times[0] == 5.0
    gaps = [round(b - a, 3) for a, b in zip(launch_times, launch_times[1:])]
    assert gaps == [5.0] * 6  # 1 -> 8 readers in 35 s, as in SSB


def test_ramp_up_on_any_event_not_only_the_tick():
    m = busy_queue()
    out = m.at(6)(MessagesReady(120, 10))
    assert len(launched(out)) == 1


def test_empty_receive_resets_the_timer_and_stops_ramp_up():
    m = busy_queue()
    m.at(3)(ReceiveIssued())
    m(ReceiveReturned(empty=True))
    assert m.s.last_empty_rowset_time == m.now
    assert launched(m.at(7)(Tick())) == []  # 4 s since the empty RECEIVE
    assert len(launched(m.at(8)(Tick()))) == 1  # 5 s since


def test_custom_ramp_up_threshold():
    m = busy_queue(ramp_up=2.0)
    assert launched(m.at(1.9)(Tick())) == []
    assert len(launched(m.at(2.0)(Tick()))) == 1


def test_no_ramp_up_while_a_session_waits_in_receive():
    m = busy_queue()
    m.at(1)(ReceiveIssued())  # blocked in RECEIVE: nothing it can take
    assert launched(m.at(10)(Tick())) == []
    # The timer ran since t=0; the RECEIVE returning frees the session, and that event launches.
    assert len(launched(m.at(11)(ReceiveReturned(empty=False)))) == 1


def test_ramp_up_stops_at_max_queue_readers():
    m = busy_queue(max_queue_readers=2)
    for t in range(1, 60):
        m.at(t)(ReceiveIssued())
        m(ReceiveReturned(empty=False))
        m(Tick())
    assert m.s.readers == 2 and len(m.launches()) == 2


# ---- rule 5: conversation groups (seed 004) ------------------------------------------------


def test_single_conversation_backlog_gets_a_second_reader_and_no_third():
    m = Monitor(max_queue_readers=10)
    m(MessagesReady(500, 1))
    m.at(0.1)(ReceiveIssued())
    m(ReceiveReturned(empty=False))  # reader 1 holds the only group
    m.at(5.1)(Tick())
    assert m.s.readers == 2
    m.at(5.2)(ReceiveIssued())  # reader 2 waits: the group is locked
    for t in range(6, 120):
        m.at(t)(Tick())
    assert m.s.readers == 2 and len(m.launches()) == 2
    # Even with nobody waiting, the cap holds.
    m.at(121)(ReceiveReturned(empty=False))
    m.at(200)(Tick())
    assert m.s.readers == 2


def test_more_groups_lift_the_cap():
    m = Monitor(max_queue_readers=10)
    m(MessagesReady(500, 1))
    m.at(0.1)(ReceiveIssued())
    m(ReceiveReturned(empty=False))
    m.at(5.1)(Tick())
    m.at(5.2)(ReceiveIssued())
    m(ReceiveReturned(empty=False))
    assert launched(m.at(20)(Tick())) == []  # 2 readers = 1 group + 1
    assert len(launched(m.at(21)(MessagesReady(600, 3)))) == 1


# ---- rule 6: max_queue_readers --------------------------------------------------------------


def test_max_queue_readers_zero_never_launches():
    m = Monitor(max_queue_readers=0)
    m(MessagesReady(10, 10))
    m.at(100)(Tick())
    m(ReceiveIssued())
    m.at(200)(Tick())
    assert m.launches() == []


def test_lowering_max_does_not_stop_readers_but_stops_launches():
    m = busy_queue(max_queue_readers=5)
    m.at(5)(Tick())
    assert m.s.readers == 2
    m(QueueAltered(replace(m.s.config, max_queue_readers=1)))
    assert m.s.readers == 2 and m.s.generation == 0  # not a recycle
    m.at(6)(ReceiveIssued())
    m(ReceiveReturned(empty=False))
    assert launched(m.at(30)(Tick())) == []


# ---- rule 7: readers exiting ----------------------------------------------------------------


def test_reader_exit_counts_out():
    m = busy_queue()
    m.at(5)(Tick())
    m.at(6)(ReaderExited(generation=0))
    assert m.s.readers == 1


def test_last_reader_exiting_with_backlog_is_relaunched_at_once():
    # A procedure that handles one message and returns is relaunched until a RECEIVE is empty.
    m = busy_queue()
    out = m.at(1)(ReaderExited(generation=0))
    assert len(launched(out)) == 1 and m.s.readers == 1 and m.s.state is NOTIFIED


def test_after_an_empty_receive_exit_waits_for_the_ramp_timer():
    m = busy_queue()
    m.at(1)(ReceiveIssued())
    m(ReceiveReturned(empty=True))  # its groups are locked by someone else
    assert launched(m.at(1.5)(ReaderExited(generation=0))) == []
    assert m.s.readers == 0
    assert launched(m.at(5.9)(Tick())) == []
    assert len(launched(m.at(6)(Tick()))) == 1


def test_all_readers_exit_and_no_backlog_is_inactive():
    m = busy_queue()
    m.at(2)(ReceiveIssued())
    m(ReceiveReturned(empty=True, backlog=0, ready_groups=0))
    m.at(2.5)(ReaderExited(generation=0))
    assert m.s.state is INACTIVE and m.s.readers == 0
    assert launched(m.at(50)(Tick())) == []


def test_no_backlog_is_inactive_even_with_readers_waiting():
    m = busy_queue()
    m.at(2)(ReceiveIssued())
    m(ReceiveReturned(empty=False, backlog=0, ready_groups=0))
    assert m.s.state is INACTIVE and m.s.readers == 1
    m.at(2.1)(ReceiveIssued())  # WAITFOR(RECEIVE) on an empty queue
    assert m.s.state is INACTIVE
    # A message arrives: the running reader will take it, no new launch.
    assert launched(m.at(3)(MessagesReady(1, 1))) == []
    assert m.s.state is RECEIVING
    m.at(3.01)(ReceiveReturned(empty=False, backlog=0, ready_groups=0))
    assert m.s.state is INACTIVE


def test_reader_exits_never_go_negative():
    m = Monitor()
    m(ReaderExited())
    m(ReaderExited(in_receive=True))
    assert m.s.readers == 0 and m.s.tasks_waiting == 0


def test_reader_dying_inside_receive_frees_tasks_waiting():
    m = busy_queue()
    m.at(1)(ReceiveIssued())
    assert m.s.tasks_waiting == 1
    m.at(2)(ReaderExited(generation=0, in_receive=True))
    assert m.s.tasks_waiting == 0


def test_rollback_is_a_recheck_with_new_counts():
    m = busy_queue(groups=1)
    m.at(1)(ReceiveIssued(backlog=0, ready_groups=0))
    assert m.s.state is INACTIVE
    out = m.at(2)(Rollback(backlog=1, ready_groups=1))  # message back on the queue
    assert m.s.backlog == 1 and launched(out) == []  # reader 1 still running
    assert m.s.state is RECEIVING


# ---- rule 9: activation off / on, recycle ---------------------------------------------------


def test_activation_off_never_launches_and_on_recycles():
    m = Monitor()
    m(MessagesReady(1, 1))  # the stub gets launched and never receives
    assert m.s.state is NOTIFIED
    off = replace(m.s.config, enabled=False)
    out = m.at(10)(QueueAltered(off))
    assert out == [Recycled("q", 1)] and m.s.state is INACTIVE and m.s.readers == 0
    m.at(11)(MessagesReady(5, 5))
    m.at(20)(Tick())
    assert len(m.launches()) == 1 and m.s.state is INACTIVE
    out = m.at(30)(QueueAltered(replace(off, enabled=True)))
    assert out == [Recycled("q", 2), LaunchReader("q", PROC, 2)]
    assert m.s.state is NOTIFIED and m.s.readers == 1


def test_recycle_resets_counters_and_forgets_old_readers():
    m = busy_queue()
    m.at(5)(Tick())
    m.at(6)(ReceiveIssued())
    assert (m.s.readers, m.s.tasks_waiting) == (2, 1)
    m.at(7)(QueueAltered(replace(m.s.config, enabled=False)))
    s = m.s
    assert (s.readers, s.tasks_waiting, s.generation) == (0, 0, 1)
    assert s.last_activated_time is None and s.last_empty_rowset_time is None
    assert s.backlog == 100  # the queue still holds them
    m.at(8)(QueueAltered(replace(m.s.config, enabled=True)))
    assert m.s.readers == 1 and m.s.generation == 2
    m.at(9)(ReaderExited(generation=0))  # an old reader finishing: not ours any more
    assert m.s.readers == 1
    m.at(9)(ReaderExited(generation=2))
    assert m.s.readers == 0


def test_changing_the_procedure_does_not_unstick_notified():
    m = Monitor()
    m(MessagesReady(1, 1))
    m.at(1)(QueueAltered(replace(m.s.config, procedure="app.handlers:fixed")))
    m.at(100)(Tick())
    assert m.s.state is NOTIFIED and len(m.launches()) == 1
    m.at(101)(QueueAltered(replace(m.s.config, enabled=False)))
    m.at(102)(QueueAltered(replace(m.s.config, enabled=True)))
    assert m.launches()[-1] == LaunchReader("q", "app.handlers:fixed", 2)


def test_queue_disabled_config_from_catalog():
    from kbroker.core.catalog.models import Activation, Queue

    act = Activation(procedure=PROC, max_queue_readers=3)
    cfg = MonitorConfig.from_queue(Queue(name="q", activation=act))
    assert cfg == MonitorConfig(True, "internal", PROC, 3, 5.0, 60.0)
    assert not MonitorConfig.from_queue(Queue(name="q", status="OFF", activation=act)).enabled
    assert not MonitorConfig.from_queue(Queue(name="q")).enabled
    ext = Activation(kind="external", notify_timeout=30)
    cfg = MonitorConfig.from_activation(ext, ramp_up=2.0)
    assert (cfg.kind, cfg.notify_timeout, cfg.ramp_up) == ("external", 30.0, 2.0)


# ---- rule 10: external activation -----------------------------------------------------------


def test_external_notifies_instead_of_launching():
    m = Monitor(kind="external", procedure=None, notify_timeout=60)
    out = m(MessagesReady(3, 2))
    assert out == [NotifyExternal("q", 3, 2)]
    assert m.s.state is NOTIFIED and m.s.readers == 0 and m.s.last_notified_time == m.now


def test_external_renotifies_after_timeout_while_nobody_receives():
    m = Monitor(kind="external", procedure=None, notify_timeout=60)
    m(MessagesReady(3, 2))
    assert m.at(59.9)(Tick()) == []
    assert m.at(60)(Tick()) == [NotifyExternal("q", 3, 2)]
    assert m.at(100)(Tick()) == []
    assert m.at(120)(Tick()) == [NotifyExternal("q", 3, 2)]
    assert len(m.notifies()) == 3


def test_external_receive_stops_renotify_and_ramps_like_internal():
    m = Monitor(kind="external", procedure=None, notify_timeout=60)
    m(MessagesReady(50, 50))
    m.at(10)(ReceiveIssued())
    m(ReceiveReturned(empty=False))
    assert m.at(14)(Tick()) == []
    assert m.at(15)(Tick()) == [NotifyExternal("q", 50, 50)]  # piling up: one more app
    assert m.at(70)(Tick()) == []  # not the NOTIFIED time-out yet (15 + 60)
    assert len(m.at(75)(Tick())) == 1


def test_external_no_messages_no_notification():
    m = Monitor(kind="external", procedure=None)
    m(MessagesReady(1, 1))
    m.at(1)(ReceiveIssued())
    m(ReceiveReturned(empty=False, backlog=0, ready_groups=0))
    assert m.s.state is INACTIVE
    assert m.at(1000)(Tick()) == []


def test_switching_kind_recycles():
    m = Monitor()
    m(MessagesReady(1, 1))
    out = m.at(1)(QueueAltered(replace(m.s.config, kind="external")))
    assert out == [Recycled("q", 1), NotifyExternal("q", 1, 1)]


# ---- serialisation --------------------------------------------------------------------------


def test_state_round_trips_through_json():
    import json

    m = busy_queue(kind="internal", ramp_up=3.0)
    m.at(3)(Tick())
    m.at(4)(ReceiveIssued())
    d = json.loads(json.dumps(m.s.to_dict()))
    assert d["state"] == "RECEIVES_OCCURRING"
    assert MonitorState.from_dict(d) == m.s


def test_from_dict_accepts_rusanus_spelling():
    s = MonitorState.from_dict({"queue": "q", "state": "RECEIVES_OCCURING"})
    assert s.state is RECEIVING
    assert s.dmv_row() == {
        "queue": "q",
        "state": "RECEIVES_OCCURRING",
        "last_empty_rowset_time": None,
        "last_activated_time": None,
        "tasks_waiting": 0,
    }


# ---- properties -----------------------------------------------------------------------------

counts = st.tuples(st.integers(0, 50), st.integers(0, 8))
opt_counts = st.one_of(st.just((None, None)), counts)
events = st.one_of(
    counts.map(lambda c: MessagesReady(*c)),
    opt_counts.map(lambda c: ReceiveIssued(*c)),
    st.tuples(st.booleans(), opt_counts).map(lambda t: ReceiveReturned(t[0], *t[1])),
    opt_counts.map(lambda c: Rollback(*c)),
    st.tuples(st.sampled_from([None, 0, 1, 2]), st.booleans()).map(lambda t: ReaderExited(*t)),
    opt_counts.map(lambda c: Tick(*c)),
    st.builds(
        MonitorConfig,
        enabled=st.booleans(),
        kind=st.sampled_from(["internal", "external"]),
        procedure=st.just(PROC),
        max_queue_readers=st.integers(0, 4),
        ramp_up=st.sampled_from([1.0, 5.0]),
        notify_timeout=st.sampled_from([2.0, 60.0]),
    ).map(QueueAltered),
)
timeline = st.lists(st.tuples(st.floats(0, 7, allow_nan=False), events), max_size=80)
configs = st.builds(
    MonitorConfig,
    enabled=st.booleans(),
    kind=st.sampled_from(["internal", "external"]),
    procedure=st.just(PROC),
    max_queue_readers=st.integers(0, 4),
)


@settings(max_examples=400)
@given(configs, timeline)
def test_invariants_hold_for_any_event_sequence(config, steps):
    s, now = new_monitor("q", config), 0.0
    received_since_launch = True
    for dt, ev in steps:
        now += dt
        before = s
        s, out = step(s, ev, now)
        assert s.readers >= 0 and s.tasks_waiting >= 0
        assert s.backlog >= 0 and s.ready_groups >= 0
        assert MonitorState.from_dict(s.to_dict()) == s
        if isinstance(ev, (ReceiveIssued, ReceiveReturned)):
            received_since_launch = True
        activations = [a for a in out if isinstance(a, (LaunchReader, NotifyExternal))]
        assert len(activations) <= 1
        if any(isinstance(a, Recycled) for a in out):
            received_since_launch = True
        if not s.config.enabled or s.config.max_queue_readers == 0:
            assert activations == []
        for a in activations:
            if isinstance(a, LaunchReader):
                assert s.config.kind == "internal"
                # Counted at launch time, this launch included.
                assert s.readers <= min(s.config.max_queue_readers, s.ready_groups + 1)
                base = before.readers
                if s.generation != before.generation:
                    base = 0  # recycled: old readers are forgotten
                elif isinstance(ev, ReaderExited) and ev.generation in (None, before.generation):
                    base = max(0, base - 1)
                assert s.readers == base + 1  # exactly one more
            # NOTIFIED guard: a second activation needs a RECEIVE in between, or a recycle, or
            # (external only) the notify time-out.
            if not received_since_launch and isinstance(a, LaunchReader):
                raise AssertionError("launched again without a RECEIVE since the last launch")
            received_since_launch = False
            assert s.state is MonitorStatus.NOTIFIED
        if s.backlog == 0 or not s.config.enabled:
            assert s.state is MonitorStatus.INACTIVE


@settings(max_examples=200)
@given(timeline)
def test_activation_off_never_activates(steps):
    s, now = new_monitor("q", MonitorConfig(enabled=False, procedure=PROC, max_queue_readers=4)), 0.0
    for dt, ev in steps:
        if isinstance(ev, QueueAltered):
            ev = QueueAltered(replace(ev.config, enabled=False))
        now += dt
        s, out = step(s, ev, now)
        assert not [a for a in out if isinstance(a, (LaunchReader, NotifyExternal))]
        assert s.state is MonitorStatus.INACTIVE
