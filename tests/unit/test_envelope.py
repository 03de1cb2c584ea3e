"""Header codec: every envelope round-trips; any other header set is a typed MalformedRecord."""

from dataclasses import FrozenInstanceError, fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import Envelope, MalformedRecord, Message
from kbroker.core.dialogs.validation import validate_body
from kbroker.core.frozen import built
from kbroker.core.receive.group_buffer import Buffered
from kbroker.errors import MessageValidationError
from kbroker.kafka.receive.receiver import QueueReceiver

text = st.text(min_size=1, max_size=40)
envelopes = st.builds(
    Envelope,
    message_id=text,
    conversation_id=text,
    conversation_group_id=text,
    message_sequence_number=st.integers(0, 2**40),
    message_type_name=text,
    service_contract_name=text,
    from_service_name=text,
    to_service_name=text,
    to_side=st.sampled_from(["INITIATOR", "TARGET"]),
    correlation_id=st.none() | text,
    reply_to=st.none() | text,
    expires=st.none() | st.integers(0, 2**45),
    priority=st.integers(1, 10),
)


@given(envelopes)
def test_envelope_round_trips(env):
    assert Envelope.from_headers(env.headers()) == env


@given(envelopes, st.data())
def test_headers_as_text_or_without_value_decode_as_their_bytes(env, data):
    """The receive path hands a record's headers over as they come: each value bytes, or text
    or None when another client wrote it so. Either way it decodes as the same bytes would."""
    as_bytes = env.headers() + [("x-other", None)]
    mixed = [(k, v.decode() if v is not None and data.draw(st.booleans()) else v) for k, v in as_bytes]
    assert Envelope.from_headers(mixed) == Envelope.from_headers(as_bytes) == env


@given(
    st.lists(st.tuples(st.text(max_size=30), st.none() | st.binary(max_size=30) | st.text(max_size=30)), max_size=15)
)
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


@pytest.mark.parametrize(
    "header,value,named",
    [
        ("kb.message_sequence_number", b"-2", "kb.message_sequence_number=-2"),  # -1: kbroker's own
        ("kb.priority", b"0", "kb.priority=0"),
        ("kb.priority", b"11", "kb.priority=11"),
        ("kb.hop", b"-2", "kb.hop=-2"),
        ("kb.v", b"2", "kb.v is '2'"),
    ],
)
def test_well_formed_headers_out_of_range_are_malformed(header, value, named):
    """Headers another Kafka client wrote, well-formed but impossible for a SEND: refused (the
    receiver dead-letters the record) with the value named, never delivered."""
    env = Envelope("m", "c", "g", 0, "T", "C", "F", "S", "TARGET")
    hs = [h for h in env.headers() if h[0] != header] + [(header, value)]
    with pytest.raises(MalformedRecord) as raised:
        Envelope.from_headers(hs)
    assert named in str(raised.value)


@pytest.mark.parametrize(
    "validation,body,ok",
    [
        ("NONE", b"\xff\x00anything", True),
        ("EMPTY", b"", True),
        ("EMPTY", b"x", False),
        ("JSON", b'{"a": 1}', True),
        ("JSON", b"{a: 1}", False),
        ("WELL_FORMED_XML", b"<a><b/></a>", True),
        ("WELL_FORMED_XML", b"<a><b></a>", False),
        ("WELL_FORMED_XML", b'<!DOCTYPE x [<!ENTITY e "boom">]><a>&e;</a>', False),
    ],
)
def test_body_validation(validation, body, ok):
    if ok:
        validate_body("T", validation, body)
    else:
        with pytest.raises(MessageValidationError, match=validation):
            validate_body("T", validation, body)


@given(envelopes)
def test_built_is_the_object_the_constructor_makes(env):
    """frozen.built fills a frozen record's fields without its __init__: the same object."""
    kw = {f.name: getattr(env, f.name) for f in fields(Envelope)}
    made = built(Envelope, kw)
    assert type(made) is Envelope and made == env and hash(made) == hash(env)
    assert vars(made) == vars(env)
    with pytest.raises(FrozenInstanceError):
        made.priority = 1  # type: ignore[misc]


@pytest.mark.parametrize("cls", [Envelope, Message])
def test_the_records_built_have_nothing_a_field_fill_would_miss(cls):
    assert not hasattr(cls, "__post_init__") and "__slots__" not in vars(cls)


@given(envelopes)
def test_a_decoded_envelope_and_its_message_have_every_field(env):
    """The two places that build per message without __init__ give every field a value."""
    decoded = Envelope.from_headers(env.headers())
    assert vars(decoded).keys() == {f.name for f in fields(Envelope)}

    class Record:
        def value(self) -> bytes:
            return b"{}"

    receiver = QueueReceiver.__new__(QueueReceiver)
    receiver.queue = "Q"
    msg = receiver._to_message(Buffered(decoded, Record(), 0, 7, 1_700_000_000_000))  # type: ignore[arg-type]
    assert vars(msg).keys() == {f.name for f in fields(Message)}
    assert msg == Message(**{f.name: getattr(msg, f.name) for f in fields(Message)})
    assert (msg.conversation_id, msg.message_id, msg.offset, msg.body) == (
        env.conversation_id,
        env.message_id,
        7,
        b"{}",
    )
