"""Publish/subscribe's subscription table (core/transport/subscriptions.py) and the types a publish
is routed by (event_types, sdk/transport/publishing.py): type_name cuts an assembly-qualified name
to the full type name and refuses empty, control-character and over-long names; enclosed_types
reads the EnclosedMessageTypes header in order, each type once; event_types takes a type, a list
or the header, else InvalidArgumentError. Subscription records round-trip through
subscribe_record/unsubscribe_record and from_subscription, every malformed record is refused with
MalformedRecord (and a fuzz: nothing else), and SubscriptionTable, driven by random subscribes,
replacements and unsubscribes, agrees with a plain dict on len, all and subscribers."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport.endpoint import QUEUE_RE
from kbroker.core.transport.message import ENCLOSED_MESSAGE_TYPES
from kbroker.core.transport.subscriptions import (
    MAX_TYPE,
    Subscription,
    SubscriptionTable,
    enclosed_types,
    from_subscription,
    subscribe_record,
    subscription_key,
    subscriptions_topic,
    type_name,
    unsubscribe_record,
)
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.publishing import event_types

TOPIC = subscriptions_topic("ns")
AQN = "Sales.OrderPlaced, Sales, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"

# --- type names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (AQN, "Sales.OrderPlaced"),
        ("Sales.OrderPlaced", "Sales.OrderPlaced"),
        ("  Sales.OrderPlaced \t, Sales", "Sales.OrderPlaced"),
        ("\tSales.IOrder\n", "Sales.IOrder"),
        ("Ventes.CommandePassée, Ventes", "Ventes.CommandePassée"),
        ("販売.注文済み", "販売.注文済み"),
        ("Sales.Envelope`1[[Sales.OrderPlaced", "Sales.Envelope`1[[Sales.OrderPlaced"),  # cut at the first ','
        ("Sales.Outer+Inner, Sales", "Sales.Outer+Inner"),
        ("List<Order>", "List<Order>"),
        ("T" * MAX_TYPE + ", Assembly", "T" * MAX_TYPE),
    ],
)
def test_type_name(text, name):
    assert type_name(text) == name


@pytest.mark.parametrize(
    "text",
    ["", "   ", ", Assembly", " , Sales", "Sales\x00Order", "Sales\nOrder", "A\x1fB", "A\x7fB", "T" * (MAX_TYPE + 1)],
)
def test_type_name_refuses(text):
    with pytest.raises(ValueError):
        type_name(text)


@pytest.mark.parametrize("value", [None, 1, b"Sales.OrderPlaced", ["Sales.OrderPlaced"]])
def test_type_name_refuses_non_text(value):
    with pytest.raises(ValueError, match="text"):
        type_name(value)


@pytest.mark.parametrize("text", ["Sales\x85Order", "Sales\x9bOrder"])
def test_type_name_refuses_c1_controls(text):
    with pytest.raises(ValueError):
        type_name(text)


def test_enclosed_types():
    header = f"{AQN};Sales.IOrderPlaced, Sales;; ;Sales.OrderPlaced, Sales, Version=2.0.0.0;Sales.IEvent;"
    assert enclosed_types(header) == ["Sales.OrderPlaced", "Sales.IOrderPlaced", "Sales.IEvent"]
    assert enclosed_types("B;A;B;A") == ["B", "A"]
    assert enclosed_types(" Sales.OrderPlaced ") == ["Sales.OrderPlaced"]


@pytest.mark.parametrize("header", ["", ";", " ; ;", "A;, Sales", "A;B\x00C", "A;" + "T" * (MAX_TYPE + 1)])
def test_enclosed_types_refuses(header):
    with pytest.raises(ValueError):
        enclosed_types(header)


def test_event_types():
    assert event_types(AQN, {}) == ["Sales.OrderPlaced"]
    assert event_types(["B", "A, Asm", "B, Asm, Version=2"], {}) == ["B", "A"]
    assert event_types(("Sales.OrderPlaced",), {ENCLOSED_MESSAGE_TYPES: "Other"}) == ["Sales.OrderPlaced"]  # given wins
    assert event_types(None, {ENCLOSED_MESSAGE_TYPES: f"{AQN};Sales.IEvent"}) == ["Sales.OrderPlaced", "Sales.IEvent"]


@pytest.mark.parametrize(
    ("event_type", "headers", "match"),
    [
        (None, {}, ENCLOSED_MESSAGE_TYPES),
        (None, {"Other": "Sales.OrderPlaced"}, ENCLOSED_MESSAGE_TYPES),
        (None, {ENCLOSED_MESSAGE_TYPES: " ; "}, "no type"),
        ([], {ENCLOSED_MESSAGE_TYPES: "Sales.OrderPlaced"}, "at least one"),
        ("", {}, "empty"),
        (["A", ", Asm"], {}, "empty"),
        (["A", 7], {}, "text"),
    ],
)
def test_event_types_refuses(event_type, headers, match):
    with pytest.raises(InvalidArgumentError, match=match):
        event_types(event_type, headers)


# --- records ----------------------------------------------------------------------------------

ENDPOINTS = st.from_regex(r"[A-Za-z0-9_.-]{1,150}", fullmatch=True)
TYPES = (
    st.text(st.characters(codec="utf-8", exclude_categories=("C",), exclude_characters=","), min_size=1, max_size=40)
    .map(str.strip)
    .filter(bool)
)


@settings(max_examples=300, deadline=None)
@given(endpoint=ENDPOINTS, queue=ENDPOINTS, event_type=TYPES)
@example(endpoint="E" * 150, queue="q-1.x_Y", event_type="T" * MAX_TYPE)
def test_round_trip(endpoint, queue, event_type):
    assert type_name(event_type) == event_type
    sub = Subscription(endpoint, queue, event_type)
    topic, key, value, headers = subscribe_record(TOPIC, sub)
    assert (topic, headers) == ("kbroker.ns.tsubscriptions", None) and key == subscription_key(endpoint, event_type)
    assert from_subscription(key, value) == ((endpoint, event_type), sub)
    topic, key2, value, headers = unsubscribe_record(TOPIC, endpoint, event_type)
    assert (topic, key2, value, headers) == (TOPIC, key, None, None)
    assert from_subscription(key2, value) == ((endpoint, event_type), None)


def key_of(*items) -> bytes:
    return orjson.dumps(list(items))


def value_of(**d) -> bytes:
    return orjson.dumps({"endpoint": "Sales", "queue": "Sales", "type": "T"} | d)


GOOD_KEY = key_of("Sales", "T")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (None, None, "key"),
        (b"", value_of(), "key"),
        (b"not json", value_of(), "key"),
        (b"\xff", None, "key"),
        (b"7", None, "key"),
        (b"null", None, "key"),
        (key_of("Sales"), None, "key"),
        (key_of("Sales", "T", "x"), None, "key"),
        (key_of(1, "T"), None, "endpoint"),
        (key_of(None, "T"), None, "endpoint"),
        (key_of("Sales", 1), None, "type"),
        (key_of("Sales", ["T"]), None, "type"),
        (key_of("", "T"), None, "endpoint"),
        (key_of("Sales\n", "T"), None, "endpoint"),  # not before a newline
        (key_of("Sa les", "T"), None, "endpoint"),
        (key_of("E" * 151, "T"), None, "endpoint"),
        (key_of("Sales", "T, Assembly"), None, "type"),
        (key_of("Sales", " T"), None, "type"),
        (key_of("Sales", ""), None, "type"),
        (key_of("Sales", "A\x00B"), None, "type"),
        (GOOD_KEY, b"not json", "not JSON"),
        (GOOD_KEY, b"\xff", "not JSON"),
        (GOOD_KEY, b'["Sales", "Sales", "T"]', "match"),
        (GOOD_KEY, b'"Sales"', "match"),
        (GOOD_KEY, value_of(endpoint="Other"), "match"),
        (GOOD_KEY, value_of(type="T, Assembly"), "match"),
        (GOOD_KEY, orjson.dumps({"queue": "Sales", "type": "T"}), "match"),
        (GOOD_KEY, orjson.dumps({"endpoint": "Sales", "type": "T"}), "queue"),
        (GOOD_KEY, value_of(queue=None), "queue"),
        (GOOD_KEY, value_of(queue=5), "queue"),
        (GOOD_KEY, value_of(queue=""), "queue"),
        (GOOD_KEY, value_of(queue="Sales\n"), "queue"),
        (GOOD_KEY, value_of(queue="q/1"), "queue"),
    ],
)
def test_from_subscription_refuses(key, value, match):
    with pytest.raises(MalformedRecord, match=match):
        from_subscription(key, value)


@pytest.mark.parametrize("key", [b'"ST"', b'{"Sales": 1, "T": 2}'])
def test_from_subscription_refuses_a_key_not_a_list(key):
    with pytest.raises(MalformedRecord):
        from_subscription(key, None)


JSONISH = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["Sales", "T", "T, Asm", "q", "", "Sales\n", " T", "a b"]),
    st.text(max_size=6),
)
KEYS = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.lists(JSONISH, max_size=3).map(orjson.dumps),
    JSONISH.map(orjson.dumps),
)
FIELDS = st.dictionaries(st.sampled_from(["endpoint", "queue", "type", "x"]), JSONISH, max_size=4)
VALUES = st.one_of(st.none(), st.binary(max_size=12), FIELDS.map(orjson.dumps), JSONISH.map(orjson.dumps))


@settings(max_examples=500, deadline=None)
@given(key=KEYS, value=VALUES)
@example(key=GOOD_KEY, value=value_of())
def test_from_subscription_fuzz(key, value):
    try:
        (endpoint, event_type), sub = from_subscription(key, value)
    except MalformedRecord:
        return
    assert QUEUE_RE.fullmatch(endpoint) and type_name(event_type) == event_type
    if value is None:
        assert sub is None
    else:
        assert sub.endpoint == endpoint and sub.type == event_type and QUEUE_RE.fullmatch(sub.queue)


# --- the table --------------------------------------------------------------------------------

E = ["Billing", "Sales", "Shipping", "A"]
T = ["Sales.OrderPlaced", "Sales.IOrder", "IEvent"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(E),
        st.sampled_from(T),
        st.one_of(st.none(), st.sampled_from(["q1", "q2", "q3"])),
        st.lists(st.sampled_from(T + ["Unknown"]), max_size=4),
    ),
    max_size=40,
)


def model_subscribers(model: dict, types: list[str]) -> list[Subscription]:
    found: dict[str, Subscription] = {}
    for t in types:
        for (endpoint, event_type), sub in model.items():
            if event_type == t and endpoint not in found:
                found[endpoint] = sub
    return [found[e] for e in sorted(found)]


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_table_matches_a_dict(ops):
    table, model = SubscriptionTable(), {}
    for endpoint, event_type, queue, types in ops:
        key = (endpoint, event_type)
        sub = None if queue is None else Subscription(endpoint, queue, event_type)
        table.apply(key, sub)
        if sub is None:
            model.pop(key, None)
        else:
            model[key] = sub
        assert len(table) == len(model)
        assert table.all() == sorted(model.values(), key=lambda s: (s.type, s.endpoint))
        got = table.subscribers(types)
        assert got == model_subscribers(model, types)
        assert len({s.endpoint for s in got}) == len(got)
        assert table.subscribers(T) == model_subscribers(model, T)


def test_table_replace_and_unknown_unsubscribe():
    table = SubscriptionTable()
    table.apply(("Sales", "IEvent"), Subscription("Sales", "q1", "IEvent"))
    table.apply(("Billing", "Sales.OrderPlaced"), Subscription("Billing", "b", "Sales.OrderPlaced"))
    table.apply(("Sales", "Sales.OrderPlaced"), Subscription("Sales", "q2", "Sales.OrderPlaced"))
    assert [s.queue for s in table.subscribers(["Sales.OrderPlaced", "IEvent"])] == ["b", "q2"]
    assert [s.queue for s in table.subscribers(["IEvent", "Sales.OrderPlaced"])] == ["b", "q1"]  # first type decides
    table.apply(("Sales", "IEvent"), Subscription("Sales", "q3", "IEvent"))  # the queue moves
    assert table.subscribers(["IEvent"]) == [Subscription("Sales", "q3", "IEvent")]
    before = table.all()
    table.apply(("Nobody", "IEvent"), None)
    table.apply(("Sales", "Unknown"), None)
    assert (len(table), table.all()) == (3, before)
    table.apply(("Sales", "IEvent"), None)
    table.apply(("Sales", "IEvent"), None)
    assert table.subscribers(["IEvent"]) == [] and len(table) == 2
    assert table.subscribers([]) == [] and table.subscribers(["Unknown"]) == []


@pytest.mark.parametrize("key", [b'[ "Sales" , "T" ]', b'["Sales","T"] '])
def test_from_subscription_refuses_a_key_spelled_otherwise(key):
    """Another spelling of a key would be another compaction slot: its tombstone could not end it."""
    with pytest.raises(MalformedRecord, match="canonical"):
        from_subscription(key, None)
