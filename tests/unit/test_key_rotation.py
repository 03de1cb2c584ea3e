"""Keys over time: a namespace's master key rotated with a grace period (records signed by the old
key accepted until it ends, replies of dialogs begun under it still opened), and a certificate
replaced by a newer one without losing the dialog that used the old."""

from __future__ import annotations

import dataclasses
import datetime
import os
import stat
import time
from pathlib import Path

import pytest

from kbroker.core.catalog.bindings import RemoteServiceBinding
from kbroker.core.catalog.models import Catalog, Service
from kbroker.core.dialogs.envelope import H_SESSION, Envelope
from kbroker.core.routing.signing import RecordRefused, sign, verified
from kbroker.core.security.dialog_security import H_SEALED, Seal, SealRefused
from kbroker.errors import InvalidArgumentError
from kbroker.kafka.routing.keys import Keys, key_id
from kbroker.kafka.routing.sealing import Opener, Sealer, TransmissionSeal
from kbroker.kafka.security.certificates import CertificateStore

REQUEST = Envelope(
    message_id="m0",
    conversation_id="c1",
    conversation_group_id="g1",
    message_sequence_number=0,
    message_type_name="//Req",
    service_contract_name="//Contract",
    from_service_name="//A/Client",
    to_service_name="//B/Server",
    to_side="TARGET",
    from_broker="a",
)


def _signed(keys: Keys, env: Envelope, value: bytes = b"v") -> tuple[bytes, bytes, list]:
    key = f"{env.from_broker}|{env.conversation_id}|{env.to_side}".encode()
    return key, value, sign(keys.private("a"), key, value, env.headers(), time.time())


def _check(keys: Keys, record: tuple[bytes, bytes, list]) -> Envelope:
    return verified(*record, public_keys=keys.public, now=time.time())


def test_a_rotated_key_is_retired_kept_and_accepted_for_its_grace_period(tmp_path: Path):
    keys = Keys(tmp_path)
    before = _signed(keys, REQUEST)
    old = key_id(keys.private("a").public_key())
    old_secret = keys.secret("a")
    new, retired, until = keys.rotate("a", grace=3600)
    assert retired == old and new != old and new == key_id(keys.private("a").public_key())
    assert datetime.timedelta(seconds=3590) < until - datetime.datetime.now(datetime.UTC) <= datetime.timedelta(hours=1)
    path = tmp_path / "retired" / f"a.{old}.key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(tmp_path / "a.key").st_mode) == 0o600
    assert keys.secret("a", old) == old_secret != keys.secret("a") == keys.secret("a", new)
    assert keys.secret("a", "0123456789abcdef") is None and keys.secret("a", "../../etc") is None
    assert [key_id(k) for k in keys.public("a")] == [new, old]
    after = _signed(keys, REQUEST)
    assert _check(keys, before) == _check(keys, after)  # signed before and after: both taken
    # A second rotation keeps the first key's grace and adds the second's.
    newer, _, _ = keys.rotate("a", grace=3600)
    assert [key_id(k) for k in keys.public("a")] == [newer, new, old]


def test_a_key_past_its_grace_period_is_refused(tmp_path: Path):
    keys = Keys(tmp_path)
    before = _signed(keys, REQUEST)
    keys.rotate("a", grace=3600)
    pub = tmp_path / "a.pub"
    text = pub.read_text()
    until = text.split("# accepted until ")[1].split("\n")[0]
    pub.write_text(text.replace(until, "2000-01-01T00:00:00+00:00"))
    assert len(keys.public("a")) == 1 and len(keys.accepted("a")) == 2
    with pytest.raises(RecordRefused, match="not that of namespace 'a'"):
        _check(keys, before)
    _check(keys, _signed(keys, REQUEST))


def test_the_far_side_accepts_what_it_imported(tmp_path: Path):
    sender, far = Keys(tmp_path / "a"), Keys(tmp_path / "b")
    before = _signed(sender, REQUEST)
    with pytest.raises(RecordRefused, match="no public key of namespace 'a'"):
        _check(far, before)
    far.import_("a", sender.export("a"))
    _check(far, before)
    sender.rotate("a")
    after = _signed(sender, REQUEST)
    with pytest.raises(RecordRefused):  # not imported yet: refused (the transmitter retries it)
        _check(far, after)
    far.import_("a", sender.export("a"))
    assert _check(far, before) == _check(far, after)
    with pytest.raises(InvalidArgumentError, match="no Ed25519 public key"):
        far.import_("c", "nothing here")
    with pytest.raises(InvalidArgumentError, match="bad key"):
        far.import_("c", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    assert far.public("c") == []


def _catalog(namespace: str) -> Catalog:
    return Catalog(
        namespace=namespace,
        services={"//A/Client": Service(name="//A/Client", queue="Q")},
        remote_service_bindings={
            "ToServer": RemoteServiceBinding(name="ToServer", to_service="//B/Server", user="server_user")
        },
    )


def _stores(tmp_path: Path) -> tuple[CertificateStore, CertificateStore]:
    sa, sb = CertificateStore(tmp_path / "ca"), CertificateStore(tmp_path / "cb")
    sb.create("ServerCert", "dbo", "Server")
    sa.import_("ServerCert", "server_user", sb.export("ServerCert"))
    sa.create("ClientCert", "dbo", "Client")
    sb.import_("ClientCert", "client_user", sa.export("ClientCert"))
    return sa, sb


def _current(keys: Keys) -> tuple[str, bytes]:
    secret = keys.secret("a")
    assert secret is not None
    return key_id(keys.private("a").public_key()), secret


def _reply(opener_b: Opener, sealer_b: Sealer, sealed: tuple, seq: int) -> tuple:
    """B opens A's sealed message, keeps its session as a target endpoint does, and seals a reply."""
    value, headers, _ = sealed
    _, saved = opener_b.open(Envelope.from_headers(headers), value, headers)
    session = dict(saved)[H_SESSION]
    reply = dataclasses.replace(REQUEST, to_side="INITIATOR", message_id=f"r{seq}", message_sequence_number=seq)
    result = sealer_b.seal(b"reply", reply.headers() + [(H_SESSION, session)], _catalog("b"))
    assert not isinstance(result, str)
    return reply, result


def test_a_dialog_in_flight_survives_a_master_key_rotation(tmp_path: Path):
    keys = Keys(tmp_path / "keys")
    sa, sb = _stores(tmp_path)
    sealer_a = Sealer("a", lambda: _current(keys), sa)
    opener_a = Opener("a", lambda m: keys.secret("a", m), sa)
    sealer_b, opener_b = Sealer("b", lambda: ("unused", b""), sb), Opener("b", lambda m: None, sb)
    first = sealer_a.seal(b"order", REQUEST.headers(), _catalog("a"))
    assert not isinstance(first, str)
    old = key_id(keys.private("a").public_key())
    reply, (value, headers, _) = _reply(opener_b, sealer_b, first, 0)
    assert Seal.from_header(dict(headers)[H_SEALED]).master == old
    keys.rotate("a")
    # The reply sealed under the old key's session opens after the rotation (its retired key).
    assert opener_a.open(reply, value, headers)[0] == b"reply"
    second_env = dataclasses.replace(REQUEST, message_id="m1", message_sequence_number=1)
    second = sealer_a.seal(b"more", second_env.headers(), _catalog("a"))
    assert not isinstance(second, str)
    seal = Seal.from_header(dict(second[1])[H_SEALED])
    assert seal.session is not None and seal.session.master == key_id(keys.private("a").public_key()) != old
    reply2, (value2, headers2, _) = _reply(opener_b, sealer_b, second, 1)
    assert opener_a.open(reply2, value2, headers2)[0] == b"reply"
    # Without the retired key, a reply of the old session is refused by name, not misread.
    (tmp_path / "keys" / "retired" / f"a.{old}.key").unlink()
    with pytest.raises(SealRefused, match=f"master key {old}"):
        Opener("a", lambda m: keys.secret("a", m), sa).open(reply, value, headers)


def test_a_certificate_replaced_by_a_newer_one_keeps_the_dialog(tmp_path: Path):
    keys = Keys(tmp_path / "keys")
    sa, sb = _stores(tmp_path)
    sealer_a = Sealer("a", lambda: _current(keys), sa)
    opener_b = Opener("b", lambda m: None, sb)
    first = sealer_a.seal(b"order", REQUEST.headers(), _catalog("a"))
    assert not isinstance(first, str)
    # B makes a newer certificate (a later expiry) and gives it to A; the old stays on B.
    sb.create("ServerCert2", "dbo", "Server", days=730)
    sa.import_("ServerCert2", "server_user", sb.export("ServerCert2"))
    second_env = dataclasses.replace(REQUEST, message_id="m1", message_sequence_number=1)
    second = sealer_a.seal(b"more", second_env.headers(), _catalog("a"))
    assert not isinstance(second, str)
    targets = [Seal.from_header(dict(s[1])[H_SEALED]).session for s in (first, second)]
    names = [sb.by_thumbprint(t.target).name for t in targets if t is not None and sb.by_thumbprint(t.target)]
    assert names == ["ServerCert", "ServerCert2"]  # the dialog's next message uses the newer one
    for value, headers, _ in (first, second):  # both open on B: old and new certificate
        assert opener_b.open(Envelope.from_headers(headers), value, headers)[0] in (b"order", b"more")
    sb.drop("ServerCert")  # dropped before the old session's message came: refused by name
    with pytest.raises(SealRefused, match="no certificate with a private key here"):
        Opener("b", lambda m: None, sb).open(Envelope.from_headers(first[1]), first[0], first[1])


def test_a_transmission_record_is_sealed_at_send_only_where_the_master_key_is_held(tmp_path: Path):
    sdk_keys = Keys(tmp_path / "sdk")
    seal = TransmissionSeal("a", sdk_keys)
    assert seal.seal(REQUEST, b"order 42") is None  # no key here: written in clear, none made
    assert not (tmp_path / "sdk" / "a.key").exists()
    worker_keys = Keys(tmp_path / "worker")
    worker_keys.private("a")
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "a.key").write_bytes((tmp_path / "worker" / "a.key").read_bytes())
    os.chmod(tmp_path / "sdk" / "a.key", 0o600)
    sealed = seal.seal(REQUEST, b"order 42")
    assert sealed is not None and b"order 42" not in sealed[0]
    headers = [*REQUEST.headers(), sealed[1]]
    transmitter = TransmissionSeal("a", worker_keys)
    assert transmitter.open(sealed[0], headers) == (b"order 42", REQUEST.headers())
    assert transmitter.open(b"clear", REQUEST.headers()) == (b"clear", REQUEST.headers())
    changed = bytearray(sealed[0])
    changed[-1] ^= 1
    with pytest.raises(SealRefused, match="changed"):
        transmitter.open(bytes(changed), headers)
    moved = dataclasses.replace(REQUEST, message_sequence_number=7)
    with pytest.raises(SealRefused):  # bound to its message: not another's body
        transmitter.open(sealed[0], [*moved.headers(), sealed[1]])
    with pytest.raises(SealRefused, match="which is not here"):  # another machine's key
        TransmissionSeal("a", Keys(tmp_path / "elsewhere")).open(sealed[0], headers)
    worker_keys.rotate("a")  # sealed before a rotation: opened with the retired key
    assert transmitter.open(sealed[0], headers)[0] == b"order 42"
