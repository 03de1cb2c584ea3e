"""Dialog security's pure rules: the security a dialog gets (Service Broker's table), session keys
wrapped and signed, bodies sealed to their message, and seal headers that refuse what they cannot
read; and the certificate store's files."""

from __future__ import annotations

import dataclasses
import datetime
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.security import dialog_security as ds
from kbroker.core.security.dialog_security import Seal, SealRefused, Security, Session
from kbroker.kafka.security.certificates import CertificateError, CertificateStore

ENV = Envelope(
    message_id="m1",
    conversation_id="c1",
    conversation_group_id="g1",
    message_sequence_number=3,
    message_type_name="//Req",
    service_contract_name="//Contract",
    from_service_name="//A/Client",
    to_service_name="//B/Server",
    to_side="TARGET",
    from_broker="a",
)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.mark.parametrize(
    ("bound", "anonymous", "owner_cert", "encryption", "expected"),
    [
        (False, False, True, True, "no remote service binding"),
        (False, False, True, False, Security.NONE),
        (False, False, False, False, Security.NONE),
        (True, True, True, True, Security.ANONYMOUS),
        (True, True, False, False, Security.ANONYMOUS),
        (True, False, True, False, Security.FULL),  # a binding secures it even with ENCRYPTION = OFF
        (True, False, False, True, "no security certificate bound to the owner"),
        (True, False, False, False, "no security certificate bound to the owner"),
    ],
)
def test_the_security_a_dialog_gets_follows_service_brokers_table(bound, anonymous, owner_cert, encryption, expected):
    got = ds.dialog_security(bound, anonymous, owner_cert, encryption)
    if isinstance(expected, Security):
        assert got is expected
    else:
        assert isinstance(got, str) and expected in got


def _sealed(env: Envelope = ENV, body: bytes = b"secret order 42") -> tuple[bytes, bytes, str]:
    root = ds.root_key(b"m" * 32, "a", env.conversation_id)
    epoch = ds.epoch_of(env.message_sequence_number, 1_700_000_000)
    return root, ds.seal_body(ds.direction_key(root, env.to_side, epoch), body, ds.associated_data(env, epoch)), epoch


def test_a_sealed_body_opens_only_as_the_message_it_was_sealed_for():
    root, sealed, epoch = _sealed()
    key = ds.direction_key(root, "TARGET", epoch)
    assert b"secret" not in sealed
    assert ds.open_body(key, sealed, ds.associated_data(ENV, epoch)) == b"secret order 42"
    changed = bytearray(sealed)
    changed[20] ^= 1
    with pytest.raises(SealRefused, match="changed"):
        ds.open_body(key, bytes(changed), ds.associated_data(ENV, epoch))
    for field, value in [
        ("message_sequence_number", 4),
        ("conversation_id", "c2"),
        ("message_id", "m2"),
        ("to_service_name", "//B/Other"),
        ("from_broker", "mallory"),
        ("message_type_name", "//Other"),
    ]:
        moved = dataclasses.replace(ENV, **{field: value})
        with pytest.raises(SealRefused):
            ds.open_body(key, sealed, ds.associated_data(moved, epoch))
    with pytest.raises(SealRefused):  # the other direction's key
        ds.open_body(ds.direction_key(root, "INITIATOR", epoch), sealed, ds.associated_data(ENV, epoch))
    with pytest.raises(SealRefused, match="shorter"):
        ds.open_body(key, b"short", b"")


def test_keys_differ_per_dialog_namespace_direction_and_epoch():
    roots = {ds.root_key(b"m" * 32, ns, c) for ns in ("a", "b") for c in ("c1", "c2")}
    assert len(roots) == 4
    root = ds.root_key(b"m" * 32, "a", "c1")
    keys = {ds.direction_key(root, side, e) for side in ("TARGET", "INITIATOR") for e in ("0.1", "1.1", "0.2")}
    assert len(keys) == 6
    assert ds.epoch_of(ds.EPOCH_MESSAGES - 1, 0) != ds.epoch_of(ds.EPOCH_MESSAGES, 0)
    assert ds.epoch_of(0, 0) != ds.epoch_of(0, ds.EPOCH_SECONDS)


def test_a_session_key_opens_with_its_certificates_key_and_its_signature_binds_the_dialog():
    root = os.urandom(32)
    wrapped = ds.wrap(root, KEY.public_key())
    assert ds.unwrap(wrapped, KEY) == root
    with pytest.raises(SealRefused, match="not for this service"):
        ds.unwrap(wrapped, OTHER)
    statement = ds.key_statement(wrapped, ENV, "t1")
    signature = ds.sign_key(OTHER, statement)
    ds.check_key_signature(OTHER.public_key(), signature, statement)
    with pytest.raises(SealRefused, match="signature"):
        ds.check_key_signature(KEY.public_key(), signature, statement)
    with pytest.raises(SealRefused, match="signature"):  # the same key and signature on another dialog
        other = ds.key_statement(wrapped, dataclasses.replace(ENV, conversation_id="c2"), "t1")
        ds.check_key_signature(OTHER.public_key(), signature, other)


def test_seal_headers_round_trip():
    session = Session(b"w" * 256, "t" * 64, "f" * 64, b"s" * 256)
    for seal in (Seal("0.1"), Seal("2.3", Session(b"w" * 256, "t")), Seal("0.1", session)):
        assert Seal.from_header(seal.to_header()) == seal


@given(st.binary(max_size=300))
def test_any_bytes_as_a_seal_header_read_or_are_refused_by_type(raw):
    try:
        Seal.from_header(raw)
    except SealRefused:
        pass


@given(
    st.dictionaries(
        st.sampled_from(["v", "e", "key"]),
        st.one_of(
            st.integers(-(2**63), 2**63 - 1), st.text(max_size=50), st.none(), st.lists(st.booleans(), max_size=2)
        ),
    )
)
def test_any_json_as_a_seal_header_reads_or_is_refused_by_type(d):
    import orjson

    try:
        Seal.from_header(orjson.dumps(d))
    except SealRefused:
        pass


def test_the_store_makes_imports_exports_and_picks_certificates(tmp_path: Path):
    mine, far = CertificateStore(tmp_path / "a"), CertificateStore(tmp_path / "b")
    made = mine.create("ClientCert", "dbo", "Client", days=30)
    assert made.has_private_key and made.owner == "dbo"
    assert stat.S_IMODE((tmp_path / "a" / "ClientCert.key").stat().st_mode) == 0o600
    pem = mine.export("ClientCert")
    assert b"PRIVATE" not in pem
    imported = far.import_("ClientCert", "client_user", pem)
    assert imported.thumbprint == made.thumbprint and not imported.has_private_key
    now = datetime.datetime.now(datetime.UTC)
    assert far.owned_by("client_user", now) == imported
    assert far.owned_by("client_user", now, private=True) is None
    assert far.owned_by("client_user", now + datetime.timedelta(days=31)) is None  # expired then
    assert mine.by_thumbprint(made.thumbprint) == made
    with pytest.raises(CertificateError, match="already"):
        far.import_("Again", "u", pem)
    with pytest.raises(CertificateError, match="not a PEM"):
        far.import_("Bad", "u", b"junk")
    with pytest.raises(CertificateError, match="certificate name"):
        mine.create("../escape", "dbo", "x")
    later = mine.create("ClientCert2", "dbo", "Client", days=60)
    assert mine.owned_by("dbo", now, private=True) == later  # the latest expiry
    os.chmod(tmp_path / "a" / "ClientCert2.key", 0o644)
    with pytest.raises(CertificateError, match="chmod 600"):
        mine.private_key(later)
    mine.drop("ClientCert2")
    assert mine.owned_by("dbo", now, private=True) == made
    assert [c.name for c in mine.certificates()] == ["ClientCert"]
