"""Header codec: every envelope round-trips; any other header set is a typed MalformedRecord."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.envelope import Envelope, MalformedRecord
from kbroker.core.validation import validate_body
from kbroker.errors import MessageValidationError

text = st.text(min_size=1, max_size=40)
envelopes = st.builds(
    Envelope,
    message_id=text, conversation_id=text, conversation_group_id=text,
    message_sequence_number=st.integers(0, 2**40), message_type_name=text,
    service_contract_name=text, from_service_name=text, to_service_name=text,
    to_side=st.sampled_from(["INITIATOR", "TARGET"]),
    correlation_id=st.none() | text, reply_to=st.none() | text,
    expires=st.none() | st.integers(0, 2**45), priority=st.integers(1, 10),
)


@given(envelopes)
def test_envelope_round_trips(env):
    assert Envelope.from_headers(env.headers()) == env


@given(st.lists(st.tuples(st.text(max_size=30), st.none() | st.binary(max_size=30)), max_size=15))
def test_arbitrary_headers_never_crash(headers):
    try:
        Envelope.from_headers(headers)
    except MalformedRecord:
        pass


def test_missing_header_is_named():
    env = Envelope("m", "c", "g", 0, "T", "C", "F", "S", "TARGET")
    hs = [h for h in env.headers() if h[0] != "kb.message_type_name"]
    with pytest.raises(MalformedRecord, match="kb.message_type_name"):
        Envelope.from_headers(hs)


@pytest.mark.parametrize("header,value,named", [
    ("kb.message_sequence_number", b"-2", "kb.message_sequence_number=-2"),  # -1: kbroker's own
    ("kb.priority", b"0", "kb.priority=0"),
    ("kb.priority", b"11", "kb.priority=11"),
    ("kb.hop", b"-2", "kb.hop=-2"),
    ("kb.v", b"2", "kb.v is '2'"),
])
def test_well_formed_headers_out_of_range_are_malformed(header, value, named):
    """Headers another Kafka client wrote, well-formed but impossible for a SEND: refused (the
    receiver dead-letters the record) with the value named, never delivered."""
    env = Envelope("m", "c", "g", 0, "T", "C", "F", "S", "TARGET")
    hs = [h for h in env.headers() if h[0] != header] + [(header, value)]
    with pytest.raises(MalformedRecord) as raised:
        Envelope.from_headers(hs)
    assert named in str(raised.value)


@pytest.mark.parametrize("validation,body,ok", [
    ("NONE", b"\xff\x00anything", True),
    ("EMPTY", b"", True),
    ("EMPTY", b"x", False),
    ("JSON", b'{"a": 1}', True),
    ("JSON", b"{a: 1}", False),
    ("WELL_FORMED_XML", b"<a><b/></a>", True),
    ("WELL_FORMED_XML", b"<a><b></a>", False),
    ("WELL_FORMED_XML", b'<!DOCTYPE x [<!ENTITY e "boom">]><a>&e;</a>', False),
])
def test_body_validation(validation, body, ok):
    if ok:
        validate_body("T", validation, body)
    else:
        with pytest.raises(MessageValidationError, match=validation):
            validate_body("T", validation, body)
