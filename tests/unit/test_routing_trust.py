"""Who may put a message into a dialog across namespaces: signed inbound records (any bytes are
an envelope or a typed refusal), the acknowledgement decoder, conversation ownership and when an
ended direction's acknowledgement is forgotten, the -8494 grant, the kept dead letter and event,
and the key files. Pure: the clock is a number, keys live in a temporary directory."""

from __future__ import annotations

import os

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.catalog.models import END_DIALOG, Catalog, Contract, ContractMessage, MessageType, Queue, Service
from kbroker.core.dialogs.arrival import NO_PERMISSION, REFUSE, SAVE, check_arrival
from kbroker.core.dialogs.envelope import H_FOLLOWS, Envelope, MalformedRecord
from kbroker.core.routing.directions import Directions, read_acks
from kbroker.core.routing.kept import ROUTING_RECORD_REFUSED, kept
from kbroker.core.routing.signing import H_SIG, H_SIG_AT, RecordRefused, sign, verified
from kbroker.core.routing.transmission import TransmissionQueue, read_ack
from kbroker.kafka.routing.keys import Keys

NOW = 1_700_000_000.0
A_KEY, C_KEY = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
PUBLIC = {"a": A_KEY.public_key(), "c": C_KEY.public_key()}


def env(seq: int = 0, conv: str = "conv-1", **kw) -> Envelope:
    fields = dict(
        message_id=f"m{seq}",
        conversation_id=conv,
        conversation_group_id="g",
        message_sequence_number=seq,
        message_type_name="//T",
        service_contract_name="//C",
        from_service_name="//A",
        to_service_name="//B",
        to_side="TARGET",
        from_broker="a",
    )
    fields.update(kw)
    return Envelope(**fields)


def signed(e: Envelope, value: bytes = b"body", by: Ed25519PrivateKey = A_KEY, at: float = NOW, follows: int = -1):
    key = f"{e.from_broker}|{e.conversation_id}|{e.to_side}".encode()
    return key, value, sign(by, key, value, e.headers() + [(H_FOLLOWS, str(follows).encode())], at)


def check(key, value, headers, now: float = NOW) -> Envelope:
    return verified(
        key, value, headers, public_keys=lambda ns: [k for k in [PUBLIC.get(ns)] if k], now=now, max_age=3600
    )


# --- signatures -------------------------------------------------------------------------------------


def test_a_signed_record_of_its_namespace_is_taken():
    got = check(*signed(env(3)))
    assert got.message_sequence_number == 3 and got.from_broker == "a"


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda k, v, h: (k, b"other body", h), "not that of namespace 'a'"),
        (
            lambda k, v, h: (k, v, [(n, b"7" if n == "kb.message_sequence_number" else x) for n, x in h]),
            "not that of namespace",
        ),
        (
            lambda k, v, h: (k, v, [(n, b"1" if n == H_FOLLOWS else x) for n, x in h]),
            "not that of namespace",
        ),  # reorder
        (lambda k, v, h: (b"a|conv-2|TARGET", v, h), "key is not its dialog direction's"),
        (lambda k, v, h: (k, v, [(n, x) for n, x in h if n != H_SIG]), "unsigned"),
        (lambda k, v, h: (k, v, h + [(H_SIG, h[-1][1])]), "unsigned"),  # two signatures
        (lambda k, v, h: (k, v, [(n, b"!!" if n == H_SIG else x) for n, x in h]), "unreadable"),
    ],
)
def test_a_changed_record_is_refused(change, reason):
    with pytest.raises(RecordRefused, match=reason) as info:
        check(*change(*signed(env(2))))
    assert info.value.sender == "a"


def test_a_record_signed_by_another_namespace_or_an_unknown_one_is_refused():
    with pytest.raises(RecordRefused, match="not that of namespace 'a'"):  # c claims to be a
        check(*signed(env(), by=C_KEY))
    with pytest.raises(RecordRefused, match="no public key of namespace 'x'"):
        check(*signed(env(from_broker="x")))


def test_an_old_signature_a_record_of_no_namespace_and_an_odd_conversation_id_are_refused():
    with pytest.raises(RecordRefused, match="a replay"):
        check(*signed(env(), at=NOW - 3601))
    assert check(*signed(env(), at=NOW - 3599)).message_sequence_number == 0
    assert check(*signed(env(to_broker="z"))).to_broker == "z"  # a forwarder's to pass on
    with pytest.raises(RecordRefused, match="no sending namespace"):
        check(b"k", b"v", env(from_broker=None).headers())
    with pytest.raises(RecordRefused, match="'|'"):
        check(*signed(env(conv="a|b")))


def test_a_retransmission_is_signed_afresh_and_replaces_the_old_signature():
    key, value, headers = signed(env(), at=NOW - 3000)
    again = sign(A_KEY, key, value, headers, NOW)
    assert [n for n, _ in again].count(H_SIG) == 1 and [n for n, _ in again].count(H_SIG_AT) == 1
    assert check(key, value, again, now=NOW + 3000).message_id == "m0"


headers_st = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "kb.v",
                "kb.message_id",
                "kb.conversation_id",
                "kb.to_side",
                "kb.message_sequence_number",
                "kb.from_broker_instance",
                H_SIG,
                H_SIG_AT,
                H_FOLLOWS,
                "x",
            ]
        )
        | st.text(max_size=8),
        st.none() | st.binary(max_size=40),
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(key=st.none() | st.binary(max_size=40), value=st.none() | st.binary(max_size=40), headers=st.none() | headers_st)
def test_any_bytes_are_an_envelope_or_a_typed_refusal(key, value, headers):
    try:
        got = check(key, value, headers)
    except RecordRefused as exc:
        assert exc.reason
    else:  # never without a valid signature
        assert isinstance(got, Envelope)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_one_changed_byte_of_a_signed_record_is_refused(data):
    key, value, headers = signed(env(5), value=b"some body")
    parts = [key, value] + [v for _, v in headers if v is not None]
    which = data.draw(st.integers(0, len(parts) - 1))
    at = data.draw(st.integers(0, len(parts[which]) - 1)) if parts[which] else None
    if at is None:
        return
    flipped = parts[which][:at] + bytes([parts[which][at] ^ 1]) + parts[which][at + 1 :]
    if which == 0:
        key = flipped
    elif which == 1:
        value = flipped
    else:
        name = headers[which - 2][0]
        headers = [(n, flipped if i == which - 2 else v) for i, (n, v) in enumerate(headers)]
        assert headers[which - 2][0] == name
    with pytest.raises(RecordRefused):
        check(key, value, headers)


# --- acknowledgements -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.none()
    | st.binary(max_size=60)
    | st.builds(
        orjson.dumps,
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["next", "error", "status", "code", "description"]), inner, max_size=4
                )
            ),
            max_leaves=8,
        ),
    )
)
def test_any_acknowledgement_bytes_are_read_or_a_typed_refusal(raw):
    try:
        ack = read_ack(raw)
    except MalformedRecord:
        return
    queue = TransmissionQueue("a")  # what the transmitter does with it never fails
    error = ack.get("error")
    queue.acknowledge(
        "a|c|TARGET", int(ack["next"]), None if not error else (int(error["code"]), str(error.get("description", "")))
    )


def test_acknowledgements_read_back_skip_what_is_not_one():
    acks, skipped = read_acks(
        {
            b"a|c1|TARGET": b'{"next": 3, "ended": 10.0}',
            b"garbage": b'{"next": 1}',
            b"a|c2|TARGET": b"[1]",
            b"a|c3|TARGET": b'{"next": -2}',
        }
    )
    assert list(acks) == ["a|c1|TARGET"] and len(skipped) == 3


# --- ownership and forgetting -------------------------------------------------------------------------


def test_a_conversation_belongs_to_the_namespace_that_sent_on_it_first():
    d = Directions(forget_after=100)
    d.load({"a|c1|TARGET": {"next": 2}})
    assert d.refusal("a", "c1") is None
    assert d.refusal("c", "c1") == "conversation c1 belongs to namespace 'a'"
    assert d.refusal("c", "c2") is None and d.refusal("a", "c2") is not None  # c2 is c's now
    saved = d.checkpoint()
    d.refusal("c", "c3")
    d.restore(saved)  # an aborted batch's claims go back
    assert "c3" not in d.owners


def test_an_ended_direction_is_forgotten_after_its_time_and_frees_its_conversation():
    d = Directions(forget_after=100)
    d.load({"a|c1|TARGET": {"next": 2, "ended": NOW}, "a|c2|TARGET": {"next": 1}})
    d.end("a|c2|TARGET", NOW + 50)
    d.end("a|c2|TARGET", NOW + 70)  # the first end counts
    assert d.due(NOW + 99) == [] and d.due(NOW + 100) == ["a|c1|TARGET"]
    d.forget(d.due(NOW + 150))
    assert d.ended == {} and d.owners == {}


# --- the grant (-8494) --------------------------------------------------------------------------------


def test_a_service_that_lists_its_remote_senders_refuses_the_others_with_8494():
    catalog = Catalog(
        namespace="b",
        message_types={"//T": MessageType(name="//T")},
        contracts={"//C": Contract(name="//C", messages=[ContractMessage(type="//T", sent_by="ANY")])},
        queues={"Q": Queue(name="Q")},
        services={"//B": Service(name="//B", queue="Q", contracts=["//C"], remote_senders=["x"])},
    )
    refused = check_arrival(catalog, env(), b"")
    assert refused.action == REFUSE and refused.code == NO_PERMISSION == -8494
    assert refused.reason == "You do not have permission to access the service '//B'."
    assert check_arrival(catalog, env(from_broker="x"), b"").action == SAVE
    assert check_arrival(catalog, env(message_type_name=END_DIALOG), b"").action == SAVE  # it may still end


@pytest.mark.parametrize("needed", ["none", "anonymous", "full"])
@pytest.mark.parametrize("came", ["none", "anonymous", "full"])
def test_a_service_refuses_dialogs_with_less_security_than_it_takes_with_8494(needed, came):
    catalog = Catalog(
        namespace="b",
        message_types={"//T": MessageType(name="//T")},
        contracts={"//C": Contract(name="//C", messages=[ContractMessage(type="//T", sent_by="ANY")])},
        queues={"Q": Queue(name="Q")},
        services={"//B": Service(name="//B", queue="Q", contracts=["//C"], remote_security=needed)},
    )
    verdict = check_arrival(catalog, env(), b"", came)
    order = ["none", "anonymous", "full"]
    if order.index(came) >= order.index(needed):
        assert verdict.action == SAVE
    else:
        assert (verdict.action, verdict.code) == (REFUSE, NO_PERMISSION)
        assert f"takes dialogs with {needed} dialog security, and this one has {came}" in verdict.reason
    # A reply to the initiator and the end of a dialog are never refused for it.
    assert check_arrival(catalog, env(to_side="INITIATOR"), b"", came).action == SAVE
    assert check_arrival(catalog, env(message_type_name=END_DIALOG), b"", came).action == SAVE


# --- kept records and keys ----------------------------------------------------------------------------


class Consumed:
    def topic(self):
        return "kbroker.b.inbound"

    def partition(self):
        return 2

    def offset(self):
        return 41

    def key(self):
        return b"k"

    def value(self):
        return b"v"

    def headers(self):
        return [("x", b"1")]


def test_a_refused_record_is_kept_with_its_reason_and_an_event():
    letter, event = kept("b", Consumed(), "unsigned", "dispatcher", sender="a", now_ms=5)
    assert letter[0] == names.deadletter_topic("b") and letter[1:3] == (b"k", b"v")
    assert dict(letter[3])["kb.dlq.reason"] == b"dispatcher refused a routing record: unsigned"
    assert dict(letter[3])["kb.dlq.offset"] == b"41"
    assert event[0] == names.events_topic("b")
    assert orjson.loads(event[2]) == {
        "event": ROUTING_RECORD_REFUSED,
        "namespace": "b",
        "reader": "dispatcher",
        "topic": "kbroker.b.inbound",
        "partition": 2,
        "offset": 41,
        "claimed_sender": "a",
        "reason": "unsigned",
        "time": 5,
    }


def test_a_master_key_is_made_once_and_its_public_key_read(tmp_path):
    keys = Keys(tmp_path)
    assert keys.public("a") == []
    first = keys.private("a")
    assert oct(os.stat(tmp_path / "a.key").st_mode & 0o777) == "0o600"
    assert [Keys(tmp_path).private("a").public_key()] == [first.public_key()] == keys.public("a")
    assert keys.public("../a") == []
    (tmp_path / "c.pub").write_text("not a key")
    assert keys.public("c") == []


# --- transport reports ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=40)
    | st.builds(
        orjson.dumps,
        st.recursive(
            st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=4),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(
                        ["at", "messages", "connections", "forwarded", "read_to", "partition", "offset", "0", "²"]
                    ),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=10,
        ),
    )
)
def test_any_transport_report_bytes_are_a_report_the_views_can_read_or_none(raw):
    from kbroker.kafka.routing.views import _report

    report = _report(raw)
    if report is not None:  # what transmission_rows and the other views read of it
        float(report["at"])
        for row in report.get("messages", []):
            (row["partition"], row["offset"])
        {int(p): int(o) for p, o in report.get("read_to", {}).items()}
        [dict(r) for r in report.get("connections", []) + report.get("forwarded", [])]


def test_remote_senders_must_name_namespaces():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="no namespace name"):
        Service(name="//B", queue="Q", remote_senders=["ok", "not a namespace"])
    assert Service(name="//B", queue="Q", remote_senders=[]).remote_senders == []  # nobody may send


def test_a_master_key_that_cannot_be_made_is_a_typed_error(tmp_path):
    from kbroker.errors import InvalidArgumentError

    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidArgumentError, match="no master key and none can be made"):
        Keys(tmp_path / "file" / "keys").private("a")
    (tmp_path / "b.key").write_text("garbage")
    with pytest.raises(InvalidArgumentError, match="cannot read the master key of namespace 'b'"):
        Keys(tmp_path).private("b")
