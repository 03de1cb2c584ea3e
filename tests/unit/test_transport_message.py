"""The transport message's record form (core/transport/message.py): every column round-trips
through to_headers/from_record, a malformed record is refused with MalformedRecord naming its
problem (and never with anything else), and new_message validates what a sender passes."""

from __future__ import annotations

import uuid
from dataclasses import fields

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport.message import (
    COLUMNS,
    ENCLOSED_MESSAGE_TYPES,
    H_CORRELATION_ID,
    H_EXPIRES,
    H_HEADERS,
    H_ID,
    H_RECOVERABLE,
    H_REPLY_TO,
    MAX_ADDRESS,
    MESSAGE_ID,
    REPLY_TO_ADDRESS,
    TRANSPORT_MESSAGE_TYPE,
    TransportEnvelope,
    TransportMessage,
    as_envelope,
    canonical_id,
    format_expires,
    from_record,
    new_message,
    parse_expires,
    to_headers,
    with_position,
)

GUID = "5f2b1c3e-9a4d-4e6f-8b7a-0c1d2e3f4a5b"
EXPIRES_MS = 1_795_593_600_123  # 2026-11-25T08:00:00.123Z: a millisecond that must survive


def good_headers(**over: bytes | None) -> list[tuple[str, bytes | None]]:
    cols: dict[str, bytes | None] = {H_ID: GUID.encode(), H_RECOVERABLE: b"true", H_HEADERS: b"{}"}
    cols.update(over)
    return [(k, v) for k, v in cols.items() if v is not None]


def roundtrip(msg: TransportMessage, value: bytes | None = None) -> TransportMessage:
    return from_record(to_headers(msg), msg.body if value is None else value)


# --- round trips ---------------------------------------------------------------------------------


def test_every_column_round_trips():
    msg = TransportMessage(
        GUID,
        b"\x00\xffbinary",
        {MESSAGE_ID: GUID, ENCLOSED_MESSAGE_TYPES: "Ns.Order, Asm", REPLY_TO_ADDRESS: "Sales.m1"},
        correlation_id="corr-1",
        reply_to_address="Sales.m1",
        recoverable=True,
        expires=EXPIRES_MS,
    )
    hs = to_headers(msg)
    assert [k for k, _ in hs] == [H_ID, H_RECOVERABLE, H_HEADERS, H_CORRELATION_ID, H_REPLY_TO, H_EXPIRES]
    assert dict(hs)[H_EXPIRES] == b"2026-11-25T08:00:00.123Z"
    assert dict(hs)[H_ID] == GUID.encode()
    assert orjson.loads(dict(hs)[H_HEADERS]) == dict(msg.headers)
    back = from_record(hs, msg.body, queue="Billing", partition=2, offset=41, timestamp_ms=7)
    assert back == TransportMessage(
        GUID, msg.body, dict(msg.headers), "corr-1", "Sales.m1", True, EXPIRES_MS, "Billing", 2, 41, 7
    )


def test_null_columns_are_left_out_and_come_back_null():
    msg = TransportMessage(GUID)
    hs = to_headers(msg)
    assert {k for k, _ in hs} == {H_ID, H_RECOVERABLE, H_HEADERS}
    back = from_record(hs, None)
    assert (back.correlation_id, back.reply_to_address, back.expires, back.body, back.headers) == (
        None,
        None,
        None,
        None,
        {},
    )


def test_none_body_and_empty_body_stay_distinct():
    assert roundtrip(TransportMessage(GUID, None)).body is None
    assert roundtrip(TransportMessage(GUID, b"")).body == b""


def test_recoverable_false_round_trips():
    msg = TransportMessage(GUID, b"x", recoverable=False)
    assert dict(to_headers(msg))[H_RECOVERABLE] == b"false"
    assert roundtrip(msg).recoverable is False


@pytest.mark.parametrize(
    "text,value", [("true", True), ("false", False), ("1", True), ("0", False), ("TRUE", True), (" False ", False)]
)
def test_recoverable_spellings_a_plain_producer_may_write(text, value):
    assert from_record(good_headers(**{H_RECOVERABLE: text.encode()}), None).recoverable is value


@pytest.mark.parametrize("ms", [EXPIRES_MS, EXPIRES_MS - 123, EXPIRES_MS + 876, 1, 0, 253_402_300_799_999])
def test_expires_keeps_millisecond_precision(ms):
    assert parse_expires(format_expires(ms)) == ms
    assert roundtrip(TransportMessage(GUID, expires=ms)).expires == ms


@pytest.mark.parametrize(
    "text,ms",
    [
        ("2026-11-25T08:00:00.123Z", EXPIRES_MS),
        ("2026-11-25T08:00:00.123+00:00", EXPIRES_MS),
        ("2026-11-25T09:00:00.123+01:00", EXPIRES_MS),
        ("2026-11-25T08:00:00.123", EXPIRES_MS),  # no offset: UTC, as the table's datetime
        ("2026-11-25T08:00:00.123z", EXPIRES_MS),
    ],
)
def test_expires_spellings(text, ms):
    assert from_record(good_headers(**{H_EXPIRES: text.encode()}), None).expires == ms


def test_unicode_headers_and_addresses_round_trip():
    headers = {
        "NServiceBus.EnclosedMessageTypes": "Ünïcødé.Évènement, Åssembly",
        "emoji 🚀": "✓ ok",
        "中文键": "值",
        "empty": "",
    }
    msg = TransportMessage(GUID, "bødy".encode(), headers, correlation_id="κορρ-🚀", reply_to_address="Sales.m1")
    back = roundtrip(msg)
    assert back.headers == headers
    assert back.correlation_id == "κορρ-🚀"


def test_empty_correlation_id_is_not_null():
    assert roundtrip(TransportMessage(GUID, correlation_id="")).correlation_id == ""


def test_other_headers_are_ignored():
    hs = good_headers() + [("traceparent", b"00-abc"), ("kb.whatever", None), ("id", b"not-a-column")]
    assert from_record(hs, b"v").id == GUID


def test_id_is_read_in_canonical_form():
    upper = GUID.upper()
    assert from_record(good_headers(**{H_ID: upper.encode()}), None).id == GUID
    assert from_record(good_headers(**{H_ID: ("{" + GUID + "}").encode()}), None).id == GUID
    assert canonical_id(uuid.UUID(GUID).hex) == GUID


def test_the_envelope_makes_each_message_a_group_of_its_own():
    msg = TransportMessage(GUID, b"x", correlation_id="c", reply_to_address="r", expires=EXPIRES_MS)
    env = as_envelope(msg, "Billing")
    assert (env.message_id, env.conversation_id, env.conversation_group_id) == (GUID, GUID, GUID)
    assert env.message_type_name == TRANSPORT_MESSAGE_TYPE
    assert (env.correlation_id, env.reply_to, env.expires, env.to_service_name) == ("c", "r", EXPIRES_MS, "Billing")


@given(
    st.uuids(),
    st.booleans(),
    st.sampled_from(["{}", "urn:uuid:{}", "{{{}}}", " {} "]),
    st.sampled_from([str, lambda u: u.replace("-", "")]),
)
def test_an_id_in_any_accepted_spelling_comes_back_as_uuid_writes_it(u, upper, wrap, hyphens):
    """canonical_id returns a canonical Id as it is (every Id kbroker writes) and rewrites any
    other spelling it accepts: either way the text uuid writes."""
    text = wrap.format(hyphens(str(u).upper() if upper else str(u)))
    assert canonical_id(text) == str(u)


def test_the_envelope_is_the_one_its_constructor_makes_with_every_field():
    """as_envelope fills the envelope without its __init__ (frozen.built): every field, the same object."""
    msg = TransportMessage(GUID, b"x", correlation_id="c", reply_to_address="r", expires=EXPIRES_MS)
    env = as_envelope(msg, "Billing")
    assert vars(env).keys() == {f.name for f in fields(TransportEnvelope)}
    made = TransportEnvelope(
        message=msg,
        message_id=GUID,
        conversation_id=GUID,
        conversation_group_id=GUID,
        message_sequence_number=0,
        message_type_name=TRANSPORT_MESSAGE_TYPE,
        service_contract_name="",
        from_service_name="",
        to_service_name="Billing",
        to_side="TARGET",
        correlation_id="c",
        reply_to="r",
        expires=EXPIRES_MS,
    )
    assert env == made and vars(env) == vars(made) and type(env) is TransportEnvelope


def test_with_position_and_as_dict():
    msg = with_position(TransportMessage(GUID, b"\xff\xfe", {"a": "b"}, expires=EXPIRES_MS), "Q", 3, 99, 1234)
    assert (msg.queue, msg.partition, msg.row_version, msg.enqueued_ms) == ("Q", 3, 99, 1234)
    d = msg.as_dict()
    assert d["Body"] is None and d["body_hex"] == "fffe"
    assert d["Expires"] == "2026-11-25T08:00:00.123Z" and d["RowVersion"] == 99 and d["Headers"] == {"a": "b"}
    assert TransportMessage(GUID, "é".encode()).as_dict()["Body"] == "é"
    assert msg.expired(EXPIRES_MS) and not msg.expired(EXPIRES_MS - 1)
    assert not TransportMessage(GUID).expired(2**62)


# --- malformed records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers,problem",
    [
        ([(H_RECOVERABLE, b"true"), (H_HEADERS, b"{}")], "missing column header(s) Id"),
        ([(H_ID, GUID.encode()), (H_HEADERS, b"{}")], "missing column header(s) Recoverable"),
        ([(H_ID, GUID.encode()), (H_RECOVERABLE, b"true")], "missing column header(s) Headers"),
        ([], "missing column header(s) Id, Recoverable, Headers"),
        (good_headers(**{H_ID: b"not-a-guid"}), "Id 'not-a-guid' is not a GUID"),
        (good_headers(**{H_ID: b""}), "is not a GUID"),
        (good_headers(**{H_ID: GUID.encode() + b"0"}), "is not a GUID"),
        (good_headers(**{H_RECOVERABLE: b"yes"}), "Recoverable is 'yes', not true or false"),
        (good_headers(**{H_RECOVERABLE: b""}), "Recoverable is '', not true or false"),
        (good_headers(**{H_HEADERS: b"{not json"}), "Headers is not JSON"),
        (good_headers(**{H_HEADERS: b""}), "Headers is not JSON"),
        (good_headers(**{H_HEADERS: b'["a", "b"]'}), "Headers is not a JSON object of strings"),
        (good_headers(**{H_HEADERS: b'{"a": 1}'}), "Headers is not a JSON object of strings"),
        (good_headers(**{H_HEADERS: b'{"a": null}'}), "Headers is not a JSON object of strings"),
        (good_headers(**{H_HEADERS: b"null"}), "Headers is not a JSON object of strings"),
        (good_headers(**{H_EXPIRES: b"tomorrow"}), "Expires 'tomorrow' is not an ISO 8601 time"),
        (good_headers(**{H_EXPIRES: b"2026-13-01T00:00:00Z"}), "is not an ISO 8601 time"),
        (good_headers(**{H_EXPIRES: b""}), "is not an ISO 8601 time"),
        (good_headers() + [(H_ID, GUID.encode())], "column header 'Id' appears twice"),
        (good_headers(**{H_CORRELATION_ID: b"c"}) + [(H_CORRELATION_ID, b"c")], "'CorrelationId' appears twice"),
        (good_headers(**{H_CORRELATION_ID: b"c" * (MAX_ADDRESS + 1)}), "CorrelationId is longer than 255 characters"),
        (good_headers(**{H_REPLY_TO: b"r" * (MAX_ADDRESS + 1)}), "ReplyToAddress is longer than 255 characters"),
        (good_headers(**{H_HEADERS: b'{"a": "\xff"}'}), "column header 'Headers' is not UTF-8"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_malformed_record_names_its_problem(headers, problem):
    with pytest.raises(MalformedRecord) as info:
        from_record(headers, b"body")
    assert problem in str(info.value)


def test_no_headers_at_all_is_malformed():
    with pytest.raises(MalformedRecord, match="missing column header"):
        from_record(None, b"body")


def test_addresses_of_exactly_255_characters_are_fine():
    msg = from_record(good_headers(**{H_CORRELATION_ID: b"c" * MAX_ADDRESS, H_REPLY_TO: b"r" * MAX_ADDRESS}), None)
    assert len(msg.correlation_id or "") == len(msg.reply_to_address or "") == MAX_ADDRESS


@pytest.mark.parametrize("bad_id", ["٠" * 32, "0_" + "0" * 30, "+" + "0" * 31, "0x" + "0" * 30])
def test_an_id_that_is_no_guid_text_is_malformed(bad_id):
    # uuid.UUID alone ends in int(hex, 16), which reads non-ASCII digits, '_' and a leading '+':
    # these would all be the nil GUID, and different garbage Ids would collide.
    with pytest.raises(MalformedRecord):
        from_record(good_headers(**{H_ID: bad_id.encode()}), None)


# --- properties --------------------------------------------------------------------------------------

column_names = st.sampled_from(COLUMNS) | st.text(max_size=12)
column_values = (
    st.none()
    | st.binary(max_size=40)
    | st.sampled_from(
        [
            GUID.encode(),
            b"true",
            b"false",
            b"1",
            b"{}",
            b'{"a":"b"}',
            b"[]",
            b"2026-11-25T08:00:00.123Z",
            b"9999-12-31T23:59:59-23:59",
            b"0001-01-01T00:00:00+01:00",
            b"x" * 300,
        ]
    )
    | st.text(max_size=40).map(str.encode)
    | st.text(max_size=40)
)


@settings(max_examples=500)
@given(st.lists(st.tuples(column_names, column_values), max_size=10), st.none() | st.binary(max_size=20))
def test_from_record_raises_only_malformed_record(headers, value):
    try:
        msg = from_record(headers, value)
    except MalformedRecord:
        return
    assert isinstance(msg, TransportMessage) and msg.body == value


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from(COLUMNS), max_size=8), st.dictionaries(st.sampled_from(COLUMNS), column_values, max_size=6)
)
def test_from_record_on_column_headers_raises_only_malformed_record(order, values):
    headers = [(k, values.get(k, b"")) for k in order] + good_headers()
    try:
        from_record(headers, None)
    except MalformedRecord:
        pass


addresses = st.none() | st.text(max_size=MAX_ADDRESS)
messages = st.builds(
    TransportMessage,
    id=st.uuids().map(str),
    body=st.none() | st.binary(max_size=64),
    headers=st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=6),
    correlation_id=addresses,
    reply_to_address=addresses,
    recoverable=st.booleans(),
    # From the epoch to the last millisecond of 9999 (the column's datetime range that matters).
    expires=st.none() | st.integers(0, 253_402_300_799_999),
)


@settings(max_examples=400)
@given(messages)
def test_to_headers_then_from_record_is_identity(msg):
    assert from_record(to_headers(msg), msg.body) == msg


@settings(max_examples=300)
@given(messages, st.data())
def test_column_values_as_text_decode_as_their_bytes(msg, data):
    """The receiver hands a record's headers over as they come: bytes, or text another client wrote."""
    hs = [(k, v.decode() if v is not None and data.draw(st.booleans()) else v) for k, v in to_headers(msg)]
    assert from_record(hs, msg.body) == msg


# --- new_message ---------------------------------------------------------------------------------------


def test_new_message_sets_expires_and_generates_ids():
    m = new_message(
        b"b",
        {"h": "v"},
        now_ms=1000,
        time_to_be_received=1.5,
        correlation_id="c",
        reply_to_address="R",
        recoverable=False,
    )
    assert (m.expires, m.correlation_id, m.reply_to_address, m.recoverable, m.headers) == (
        2500,
        "c",
        "R",
        False,
        {"h": "v"},
    )
    assert str(uuid.UUID(m.id)) == m.id
    assert new_message(None, now_ms=0).id != new_message(None, now_ms=0).id
    assert new_message(None, now_ms=0).expires is None
    assert new_message(None, now_ms=0, message_id=GUID.upper()).id == GUID


@pytest.mark.parametrize(
    "kwargs,problem",
    [
        ({"message_id": "nope"}, "is not a GUID"),
        ({"correlation_id": "c" * (MAX_ADDRESS + 1)}, "CorrelationId"),
        ({"correlation_id": 5}, "CorrelationId"),
        ({"reply_to_address": "r" * (MAX_ADDRESS + 1)}, "ReplyToAddress"),
        ({"recoverable": 1}, "Recoverable"),
        ({"recoverable": None}, "Recoverable"),
        ({"headers": {"a": 1}}, "Headers"),
        ({"headers": {1: "a"}}, "Headers"),
        ({"time_to_be_received": 0}, "time_to_be_received"),
        ({"time_to_be_received": -1}, "time_to_be_received"),
        ({"time_to_be_received": True}, "time_to_be_received"),
        ({"time_to_be_received": float("nan")}, "time_to_be_received"),
        ({"body": "text"}, "Body"),
        ({"body": bytearray(b"x")}, "Body"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_new_message_refuses_bad_arguments(kwargs, problem):
    args = {"body": b"x", "now_ms": 0, **kwargs}
    body = args.pop("body")
    with pytest.raises(ValueError, match=problem):
        new_message(body, **args)


@pytest.mark.parametrize("ttbr", [float("inf"), 1e12, 1e300])
def test_new_message_refuses_a_time_to_be_received_expires_cannot_hold(ttbr):
    # inf once raised OverflowError, and an Expires past the year 9999 made to_headers (and so
    # TransportEndpoint.send) fail with a bare ValueError/OverflowError.
    with pytest.raises(ValueError, match="time_to_be_received"):
        msg = new_message(b"x", now_ms=0, time_to_be_received=ttbr)
        to_headers(msg)


@pytest.mark.parametrize("expires", ["0001-01-01T00:00:00+01:00", "0000-12-31T23:00:00Z"])
def test_an_expires_it_could_not_write_again_is_malformed(expires: str) -> None:
    hs = to_headers(new_message(b"x", now_ms=0))
    with pytest.raises(MalformedRecord, match="years 1-9999"):
        from_record([*hs, ("Expires", expires.encode())], b"x")
