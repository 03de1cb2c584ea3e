"""Every decoder of a topic kbroker reads (core/rejected.py's rule, G8): any key and value in, a
decoded value or a typed rejection (Rejected) out, never another exception. Bytes at random,
JSON at random, and JSON with the right field names but values at random (what gets past the
first checks). And the allow-list of activation procedures, whatever names a config."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.activation import monitor_codec
from kbroker.core.activation.monitor import MonitorConfig, MonitorState, Tick, new_monitor, step
from kbroker.core.analytics.analytics_records import (
    analytics_row,
    armed_timer,
    control_command,
    progress_snapshot,
)
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.dialogs.endpoint_records import endpoint_record
from kbroker.core.dialogs.timers import firing_records, timer_value
from kbroker.core.reader_reports import reader_report
from kbroker.core.rejected import Consumed, Rejected, json_object, rejection_records, text_key

NS = "ns"
QUEUE_TOPIC = f"kbroker.{NS}.queue.Q"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def shaped(fields: list[str]) -> st.SearchStrategy[bytes]:
    """JSON objects with (some of) the decoder's own field names, values of any JSON type."""
    return st.dictionaries(st.sampled_from(fields) | st.text(max_size=6), json_values, max_size=len(fields) + 1).map(
        orjson.dumps
    )


any_value = st.none() | st.binary(max_size=200) | json_values.map(orjson.dumps)
any_key = st.none() | st.binary(max_size=40) | st.text(max_size=30).map(str.encode)


def decodes_or_rejects(decoder: Any, *args: Any) -> Any:
    try:
        return decoder(*args)
    except Rejected as exc:
        assert exc.reason and "\n" not in exc.reason.strip()
        return None


@settings(max_examples=300, deadline=None)
@given(
    value=any_value
    | shaped(["event", "worker", "config", "backlog", "ready_groups", "empty", "generation", "in_receive"])
    | st.sampled_from(["MessagesReady", "QueueAltered", "Tick"]).flatmap(
        lambda e: shaped(["backlog", "ready_groups", "empty", "generation", "in_receive", "config"]).map(
            lambda raw: orjson.dumps({**orjson.loads(raw), "event": e})
        )
    )
)
def test_monitor_events_decode_to_an_event_that_steps_or_are_rejected(value):
    decoded = decodes_or_rejects(monitor_codec.decode, value)
    if decoded is not None:  # what passes must not make the monitor raise either
        event, _ = decoded
        state: MonitorState = new_monitor("Q", MonitorConfig(procedure="m:f"))
        state, _ = step(state, event, 1000.0)
        step(state, Tick(backlog=3, ready_groups=1), 1001.0)


@settings(max_examples=200, deadline=None)
@given(value=any_value | shaped(["worker", "now"]))
def test_tick_requests(value):
    decodes_or_rejects(monitor_codec.decode_tick_request, value)


KINDS = ["queue", "service", "contract", "message_type", "route", "broker_endpoint", "other"]


@settings(max_examples=300, deadline=None)
@given(
    key=any_key | st.tuples(st.sampled_from(KINDS), st.text(max_size=12)).map(lambda t: f"{t[0]}/{t[1]}".encode()),
    value=any_value
    | shaped(["name", "partitions", "activation", "queue", "contracts", "messages", "validation", "status", "address"]),
)
def test_catalog_records(key, value):
    decodes_or_rejects(catalog_record, key, value)


@settings(max_examples=300, deadline=None)
@given(
    key=any_key | st.sampled_from(["h", "h/groups", "h/lease", "h/want"]).map(str.encode),
    value=any_value
    | shaped(
        [
            "conversation_handle",
            "conversation_id",
            "side",
            "state",
            "send_sequence",
            "lifetime",
            "group_chain",
            "handle",
            "epoch",
            "owner",
            "by",
            "until",
            "fence",
        ]
    ),
)
def test_endpoint_records(key, value):
    decodes_or_rejects(endpoint_record, key, value)


TIMER_FIELDS = [
    "kind",
    "due",
    "conversation_id",
    "side",
    "contract",
    "service",
    "far_service",
    "topic",
    "key",
    "INITIATOR",
    "TARGET",
]


@settings(max_examples=300, deadline=None)
@given(
    value=any_value
    | shaped(TIMER_FIELDS)
    | st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["timer", "lifetime"]),
            "due": st.integers(0, 10),
            "conversation_id": st.text(max_size=5),
            "side": st.sampled_from(["INITIATOR", "TARGET", "X"]),
            "contract": st.text(max_size=3),
            "service": st.text(max_size=3),
            "far_service": st.text(max_size=3),
            "topic": st.sampled_from([QUEUE_TOPIC, "elsewhere", None]),
            "key": st.text(max_size=3) | st.none(),
            "INITIATOR": json_values,
            "TARGET": json_values,
        }
    ).map(orjson.dumps)
)
def test_timers_never_fire_outside_the_namespaces_queues(value):
    decoded = decodes_or_rejects(timer_value, NS, value)
    if decoded is not None:  # what passes fires only onto the namespace's queues, without raising
        from kbroker.core.dialogs.conversation_endpoint import Endpoint

        ep = Endpoint("h", "c", "INITIATOR", "g", "fg", "s", "fs", "ct", "CO")
        for topic, *_ in firing_records(decoded, lambda _handle: ep):
            assert topic == QUEUE_TOPIC
        decodes_or_rejects(armed_timer, NS, value)


@settings(max_examples=200, deadline=None)
@given(
    value=any_value
    | shaped(
        [
            "topic",
            "process",
            "at",
            "partitions",
            "buffered",
            "ready_groups",
            "locked_groups",
            "in_flight",
            "paused",
            "oldest_lock_at",
        ]
    )
)
def test_reader_reports(value):
    decodes_or_rejects(reader_report, value)


@settings(max_examples=300, deadline=None)
@given(
    value=any_value
    | shaped(["queue", "at", "partitions"])
    | st.fixed_dictionaries(
        {
            "queue": st.text(max_size=3),
            "at": st.integers(0, 10),
            "partitions": st.lists(
                st.dictionaries(st.sampled_from(["partition", "committed", "completed"]), json_values), max_size=3
            ),
        }
    ).map(orjson.dumps),
    as_text=st.booleans(),
)
def test_progress_snapshots(value, as_text):
    decodes_or_rejects(progress_snapshot, value.decode(errors="replace") if as_text and value else value)


@settings(max_examples=200, deadline=None)
@given(key=any_key, value=any_value | shaped(["command", "conversation_id", "side", "queue"]))
def test_control_commands(key, value):
    decodes_or_rejects(control_command, key, value)


@settings(max_examples=200, deadline=None)
@given(
    key=any_key | st.sampled_from([b"dialog/x", b"queue/Q/1"]),
    value=any_value
    | shaped(["queue", "window_start", "conversation_id", "side", "oldest_unreceived", "oldest_age_s", "as_of"]),
)
def test_analytics_rows(key, value):
    decoded = decodes_or_rejects(analytics_row, key, value)
    if decoded is not None and decoded[0] == "dialog":
        from kbroker.core.analytics.queue_analytics import dialog_row_at

        dialog_row_at(decoded[1], 10**12)  # the view's arithmetic takes what passed


@settings(max_examples=200, deadline=None)
@given(
    key=any_key, value=any_value, headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=3)
)
def test_any_record_has_its_dead_letter_and_event(key, value, headers):
    record = Consumed("kbroker.ns.timers", 1, 7, key, value, headers)
    letter, event = rejection_records(NS, record, "why" * 500, "reader", 1)
    assert letter[0] == "kbroker.ns.deadletter" and (letter[1], letter[2]) == (key, value)
    assert dict(letter[3])["kb.dlq.reader"] == b"reader" and dict(letter[3])["kb.dlq.offset"] == b"7"
    assert orjson.loads(event[2])["event"] == "RECORD_REJECTED"


@pytest.mark.parametrize("raw,reason", [(None, "no value"), (b"[1]", "not a JSON object"), (b"x", "not JSON")])
def test_json_object_says_why(raw, reason):
    with pytest.raises(Rejected, match=reason):
        json_object(raw)


def test_text_key_says_why():
    with pytest.raises(Rejected, match="no key"):
        text_key(None)
    with pytest.raises(Rejected, match="not UTF-8"):
        text_key(b"\xff")


def test_a_record_too_big_for_the_dead_letter_topic_goes_without_its_body():
    record = Consumed("kbroker.ns.catalog", 0, 3, b"queue/Q", b"x" * 5000, [("h", b"v")])
    letter, event = rejection_records(NS, record, "not JSON", "reader", 1, limit=2000)
    headers = dict(letter[3])
    assert letter[2] is None and headers["kb.dlq.size"] == b"5000" and headers["kb.dlq.omitted"] == b"body"
    assert headers["kb.dlq.reader"] == b"reader" and orjson.loads(event[2])["offset"] == 3
