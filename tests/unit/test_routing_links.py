"""The routing links table (core/routing/links.py): when a connection to another namespace
may be opened (seed 000: at once the first time, else on a 2nd tick once its suppression of 15 s
after a disconnect or 60 s after a failed attempt has run out), which are closed for idleness
(90 s, every 5th tick), and the sys.dm_broker_connections rows. A property test drives random
event sequences against a small reference model of those rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.routing import links as transport
from kbroker.core.routing.links import (
    CLOSED,
    CONNECTED,
    CONNECTING,
    IDLE_CLOSE,
    NEW,
    SUPPRESS_AFTER_DISCONNECT,
    SUPPRESS_AFTER_FAILURE,
    Links,
)

D = "kafka:9092/far"


def test_the_seed_timings():
    assert (SUPPRESS_AFTER_DISCONNECT, SUPPRESS_AFTER_FAILURE, IDLE_CLOSE) == (15.0, 60.0, 90.0)


# --- opening -------------------------------------------------------------------------------


def test_the_first_connection_is_allowed_at_once_without_waiting_for_a_2nd_tick():
    links = Links()
    assert links.may_connect(D, 0.0, second_tick=False)
    assert links.link(D).state == NEW
    assert links.may_connect(D, 0.0, second_tick=False)  # asking is not trying


def test_no_second_attempt_while_connecting_or_connected():
    links = Links()
    links.connecting(D, 0.0)
    assert links.link(D).state == CONNECTING and links.link(D).attempts == 1
    assert not links.may_connect(D, 1_000.0, second_tick=True)
    links.connected(D, 1.0)
    assert links.is_connected(D)
    assert not links.may_connect(D, 1_000.0, second_tick=True)


def test_after_a_failed_attempt_60_s_and_then_only_on_a_2nd_tick():
    links = Links()
    links.connecting(D, 100.0)
    links.failed(D, 100.0, "connection refused")
    link = links.link(D)
    assert (link.state, link.failures, link.last_error) == (CLOSED, 1, "connection refused")
    assert not links.may_connect(D, 100.0, second_tick=False)
    assert not links.may_connect(D, 159.999, second_tick=True)
    assert not links.may_connect(D, 160.0, second_tick=False)
    assert not links.may_connect(D, 10_000.0, second_tick=False)
    assert links.may_connect(D, 160.0, second_tick=True)


def test_each_failure_in_a_row_is_counted_and_a_connection_resets_the_count():
    links = Links()
    for i in range(3):
        links.connecting(D, 60.0 * i)
        links.failed(D, 60.0 * i, f"try {i}")
    link = links.link(D)
    assert (link.failures, link.attempts, link.last_error) == (3, 3, "try 2")
    assert link.suppressed_until == 120.0 + SUPPRESS_AFTER_FAILURE  # from the last failure
    links.connecting(D, 200.0)
    links.connected(D, 201.0)
    assert (link.failures, link.attempts, link.last_error, link.connect_time, link.last_activity) == (
        0,
        4,
        "",
        201.0,
        201.0,
    )


def test_after_a_disconnect_15_s_and_then_only_on_a_2nd_tick():
    links = Links()
    links.connecting(D, 0.0)
    links.connected(D, 0.0)
    links.disconnected(D, 50.0, "broker went away")
    link = links.link(D)
    assert (link.state, link.last_error, link.failures) == (CLOSED, "broker went away", 0)
    assert not links.is_connected(D)
    assert not links.may_connect(D, 50.0, second_tick=False)
    assert not links.may_connect(D, 64.999, second_tick=True)
    assert not links.may_connect(D, 65.0, second_tick=False)
    assert links.may_connect(D, 65.0, second_tick=True)


# --- idle close ----------------------------------------------------------------------------------


def test_idle_closes_connected_links_after_90_s_without_activity():
    links = Links()
    links.connecting(D, 0.0)
    links.connected(D, 10.0)
    assert links.idle(99.999, busy=set()) == []
    assert links.idle(100.0, busy=set()) == [D]


def test_activity_postpones_the_idle_close_and_is_counted():
    links = Links()
    links.connecting(D, 0.0)
    links.connected(D, 0.0)
    links.active(D, 50.0, sends=2, size=300)
    links.active(D, 80.0, acks=1)
    assert links.idle(169.0, busy=set()) == []
    assert links.idle(170.0, busy=set()) == [D]
    link = links.link(D)
    assert (link.sends, link.acks, link.bytes_sent, link.last_activity) == (2, 1, 300, 80.0)


def test_a_busy_destination_is_never_idle():
    links = Links()
    links.connecting(D, 0.0)
    links.connected(D, 0.0)
    assert links.idle(1_000.0, busy={D}) == []
    assert links.idle(1_000.0, busy={"other"}) == [D]


def test_only_connected_links_are_idle():
    links = Links()
    links.connecting("connecting", 0.0)
    links.connecting("failed", 0.0)
    links.failed("failed", 0.0, "x")
    links.connecting("broken", 0.0)
    links.connected("broken", 0.0)
    links.disconnected("broken", 1.0, "x")
    links.link("new")
    links.connecting("up", 0.0)
    links.connected("up", 0.0)
    assert links.idle(10_000.0, busy=set()) == ["up"]


def test_a_link_closed_for_idleness_reopens_at_once():
    links = Links()
    links.connecting(D, 0.0)
    links.failed(D, 0.0, "refused")  # an old failure: its suppression must not linger
    links.connecting(D, 60.0)
    links.connected(D, 60.0)
    links.closed(D)
    assert links.link(D).state == CLOSED and not links.is_connected(D)
    assert links.may_connect(D, 150.0, second_tick=False)
    # And it is a first connection again: a failure now suppresses it as usual.
    links.connecting(D, 150.0)
    links.failed(D, 150.0, "refused")
    assert not links.may_connect(D, 151.0, second_tick=True)
    assert links.may_connect(D, 210.0, second_tick=True)


def test_closed_right_after_a_failure_still_reopens_at_once():
    # closed() says "closed for idleness": whatever came before, the next message opens it.
    links = Links()
    links.connecting(D, 0.0)
    links.failed(D, 0.0, "x")
    links.closed(D)
    assert links.may_connect(D, 1.0, second_tick=False)


# --- rows ----------------------------------------------------------------------------------------


def test_rows_follow_sys_dm_broker_connections():
    links = Links()
    links.connecting("a", 0.0)
    links.connected("a", 5.0)
    links.active("a", 7.0, sends=3, acks=2, size=99)
    links.connecting("b", 0.0)
    links.failed("b", 10.0, "refused")
    links.link("c")
    rows = {r["destination"]: r for r in links.rows(20.0)}
    expected = {
        "destination": "a",
        "state": CONNECTED,
        "connect_time": 5.0,
        "last_activity_time": 7.0,
        "suppressed_for": 0.0,
        "failures": 0,
        "attempts": 1,
        "total_sends": 3,
        "total_acks": 2,
        "total_bytes": 99,
        "last_error": None,
    }
    assert {k: rows["a"].get(k) for k in expected} == expected  # (further columns: the history test)
    assert (rows["b"]["state"], rows["b"]["suppressed_for"], rows["b"]["last_error"], rows["b"]["failures"]) == (
        CLOSED,
        50.0,
        "refused",
        1,
    )
    assert (rows["c"]["state"], rows["c"]["last_activity_time"], rows["c"]["connect_time"]) == (NEW, None, None)
    assert [r["destination"] for r in links.rows(1_000.0)] == ["a", "b", "c"]
    assert links.rows(1_000.0)[1]["suppressed_for"] == 0.0  # never negative


def test_history_keeps_the_latest_state_changes_in_order():
    links = Links()
    links.connecting(D, 1.0)
    links.failed(D, 2.0, "x")
    links.connecting(D, 70.0)
    links.connected(D, 71.0)
    links.disconnected(D, 80.0, "y")
    links.connecting(D, 95.0)
    links.connected(D, 96.0)
    links.closed(D, 200.0)
    assert links.link(D).history == [
        (1.0, "CONNECTING"),
        (2.0, "FAILED"),
        (70.0, "CONNECTING"),
        (71.0, "CONNECTED"),
        (80.0, "DISCONNECTED"),
        (95.0, "CONNECTING"),
        (96.0, "CONNECTED"),
        (200.0, "IDLE_CLOSED"),
    ]
    assert links.rows(200.0)[0]["history"][-1] == [200.0, "IDLE_CLOSED"]
    # Without a time, an idle close is dated when the idle period ran out.
    links.connecting(D, 300.0)
    links.connected(D, 300.0)
    links.active(D, 310.0)
    links.closed(D)
    assert links.link(D).history[-1] == (310.0 + IDLE_CLOSE, "IDLE_CLOSED")
    # Bounded: only the latest few survive.
    for i in range(3 * transport.HISTORY):
        links.connecting(D, 1_000.0 + i)
        links.failed(D, 1_000.0 + i, "z")
    history = links.link(D).history
    assert len(history) == transport.HISTORY and history[-1] == (1_000.0 + 3 * transport.HISTORY - 1, "FAILED")


# --- the rules as a property -------------------------------------------------------------------

events = st.lists(
    st.tuples(
        st.sampled_from(["ask", "connect_ok", "connect_fail", "disconnect", "active", "idle_close"]),
        st.floats(0.0, 40.0),
        st.booleans(),
    ),
    max_size=40,
)


@settings(max_examples=400)
@given(events)
def test_may_connect_follows_the_seed_rules_for_any_history(history):
    """A reference model of seed 000's rules: `tried` (a connection went wrong since the last
    fresh start), the suppression deadline, and the state."""
    links = Links()
    now = 0.0
    state, tried, until, last_activity = NEW, False, 0.0, 0.0
    for event, dt, second_tick in history:
        now += dt
        allowed = links.may_connect(D, now, second_tick)
        expected = state not in (CONNECTED, CONNECTING) and (not tried or (second_tick and now >= until))
        assert allowed == expected, (event, now, state, tried, until)
        if event == "ask":
            continue
        if event in ("connect_ok", "connect_fail") and allowed:
            links.connecting(D, now)
            tried = True
            if event == "connect_ok":
                links.connected(D, now)
                state, last_activity = CONNECTED, now
            else:
                links.failed(D, now, "refused")
                state, until = CLOSED, now + SUPPRESS_AFTER_FAILURE
        elif event == "disconnect" and state == CONNECTED:
            links.disconnected(D, now, "broken")
            state, until = CLOSED, now + SUPPRESS_AFTER_DISCONNECT
        elif event == "active" and state == CONNECTED:
            links.active(D, now, sends=1)
            last_activity = now
        elif event == "idle_close":
            idle = links.idle(now, busy=set())
            assert idle == ([D] if state == CONNECTED and now - last_activity >= IDLE_CLOSE else [])
            if idle:
                links.closed(D)
                state, tried = CLOSED, False
        assert links.link(D).state == state
        assert links.is_connected(D) == (state == CONNECTED)
