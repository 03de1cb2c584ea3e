"""Dialog security on the real broker: routed dialogs sealed end to end under full and anonymous
security (a plain consumer of the inbound and dead-letter topics sees only ciphertext), a body
changed in the inbound topic or sealed for another service refused and reported, a replay
dropped, ENCRYPTION = ON holding messages until a binding exists, and no key material in the
catalog. Two namespaces on one broker, with test_routing.py's catalogs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import orjson
from cryptography.hazmat.primitives.asymmetric import rsa

from kbroker.core import names
from kbroker.core.catalog.models import ERROR
from kbroker.core.dialogs.conversation_endpoint import handle_for
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.routing.signing import sign
from kbroker.core.security import dialog_security as ds
from kbroker.core.security.dialog_security import H_LOCAL, H_SEALED, Seal, Session
from kbroker.kafka import clients
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.routing.dispatcher import Dispatcher
from kbroker.kafka.routing.keys import Keys
from kbroker.kafka.routing.transmitter import Transmitter
from kbroker.kafka.routing.views import transmission_rows
from kbroker.kafka.security.certificates import CertificateStore
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import wait_for
from tests.integration.test_routing import CLIENT, CONTRACT, REPLY, REQUEST, SERVER, catalog_yaml, receive_all
from tests.integration.test_routing_trust import kept_reasons

MARK = "plaintext-marker-7f3a"


def write_catalogs(bootstrap: str, tmp_path: Path, a: str, b: str, binding: str, security: str = "none") -> None:
    """A hosts CLIENT with `binding` (YAML of its remote_service_bindings, or ""), B hosts SERVER
    taking dialogs with `security` at least; a route each way."""
    fa, fb = tmp_path / f"{a}.yaml", tmp_path / f"{b}.yaml"
    to_b = f"routes:\n  - {{name: ToB, service_name: '{SERVER}', address: 'kafka://{bootstrap}/{b}'}}\n{binding}"
    fa.write_text(catalog_yaml(services=f"  - {{name: '{CLIENT}', queue: Q}}", routes=to_b, with_odd=True))
    fb.write_text(
        catalog_yaml(
            services=f"  - {{name: '{SERVER}', queue: Q, contracts: ['{CONTRACT}'], remote_security: {security}}}",
            routes=f"routes:\n  - {{name: ToA, service_name: '{CLIENT}', address: 'kafka://{bootstrap}/{a}'}}",
            with_odd=False,
        )
    )
    apply_paths(bootstrap, a, [fa])
    apply_paths(bootstrap, b, [fb])


def binding_yaml(anonymous: bool = False) -> str:
    return (
        "remote_service_bindings:\n"
        f"  - {{name: ToServer, to_service: '{SERVER}', user: server_user, anonymous: {str(anonymous).lower()}}}\n"
    )


def certificates(tmp_path: Path, *, client_cert: bool = True) -> tuple[CertificateStore, CertificateStore]:
    """A's and B's stores: each service's own certificate (owned by its owner, dbo) and the far
    one's imported (B's for A's binding user; A's for B, to check full security)."""
    sa, sb = CertificateStore(tmp_path / "certs-a"), CertificateStore(tmp_path / "certs-b")
    sb.create("ServerCert", "dbo", "Server")
    sa.import_("ServerCert", "server_user", sb.export("ServerCert"))
    if client_cert:
        sa.create("ClientCert", "dbo", "Client")
        sb.import_("ClientCert", "client_user", sa.export("ClientCert"))
    return sa, sb


@contextmanager
def secured(
    bootstrap: str, tmp_path: Path, a: str, b: str, *, binding: str, client_cert: bool = True, security: str = "none"
) -> Iterator[tuple[Broker, Broker, Dispatcher, CertificateStore]]:
    write_catalogs(bootstrap, tmp_path, a, b, binding, security)
    sa, sb = certificates(tmp_path, client_cert=client_cert)
    with ExitStack() as stack:
        ba = stack.enter_context(Broker(bootstrap, a))
        bb = stack.enter_context(Broker(bootstrap, b))
        dispatchers = []
        for ns, br, store in ((a, ba, sa), (b, bb, sb)):
            dispatchers.append(
                stack.enter_context(
                    Dispatcher(bootstrap, ns, lambda br=br: br.refresh_catalog(), tick=1.0, certificates=store)
                )
            )
            stack.enter_context(
                Transmitter(bootstrap, ns, lambda br=br: br.refresh_catalog(), tick=1.0, certificates=store)
            )
        yield ba, bb, dispatchers[1], sb


def sealed_records(bootstrap: str, topic: str) -> list:
    return [m for m in read_to_end(bootstrap, topic) or [] if m.headers()]


def round_trip(ba: Broker, bb: Broker, n: int, **begin) -> str:
    """n requests from A, each answered by B; A receives the replies. The conversation id."""
    with ba.transaction() as tx:
        h = tx.begin_dialog(CLIENT, SERVER, CONTRACT, **begin)
        for i in range(n):
            tx.send(h, REQUEST, {"i": i, "mark": MARK})
    got = receive_all(bb, n)
    assert [(m.message_sequence_number, orjson.loads(m.body)["mark"]) for m in got] == [(i, MARK) for i in range(n)]
    conv = got[0].conversation_id
    with bb.transaction() as tx:
        for i in range(n):
            tx.send(handle_for(conv, "TARGET"), REPLY, {"reply": i, "mark": MARK})
    replies = receive_all(ba, n)
    assert [orjson.loads(m.body)["reply"] for m in replies] == list(range(n))
    return conv


def assert_only_ciphertext(bootstrap: str, topic: str, at_least: int) -> None:
    records = sealed_records(bootstrap, topic)
    assert len(records) >= at_least, f"{len(records)} records on {topic}"
    for m in records:
        assert MARK.encode() not in (m.value() or b""), f"clear text on {topic}"
        assert any(n == H_SEALED for n, _ in m.headers()), f"an unsealed record on {topic}"
        assert not any(MARK.encode() in (v or b"") for _, v in m.headers())


def test_full_security_seals_both_directions_end_to_end(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with secured(kafka_bootstrap, tmp_path, a, b, binding=binding_yaml(), security="full") as (ba, bb, _, _):
        round_trip(ba, bb, 5)
    assert_only_ciphertext(kafka_bootstrap, names.inbound_topic(b), 5)
    assert_only_ciphertext(kafka_bootstrap, names.inbound_topic(a), 5)
    for ns in (a, b):  # sealed at SEND too: the SDK holds the namespaces' master keys here
        records = sealed_records(kafka_bootstrap, names.transmission_topic(ns))
        assert len(records) >= 5
        for m in records:
            assert MARK.encode() not in (m.value() or b"") and H_LOCAL in dict(m.headers())
    for m in sealed_records(kafka_bootstrap, names.inbound_topic(b)):
        seal = Seal.from_header(dict(m.headers())[H_SEALED])
        assert seal.session is not None and seal.session.initiator is not None  # signed: full security
    for ns in (a, b):  # no key material in the catalog
        raw = b"".join((m.value() or b"") for m in read_to_end(kafka_bootstrap, names.catalog_topic(ns)) or [])
        assert b"PRIVATE KEY" not in raw and b"CERTIFICATE" not in raw


def test_anonymous_security_needs_no_initiator_certificate(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with secured(kafka_bootstrap, tmp_path, a, b, binding=binding_yaml(anonymous=True), client_cert=False) as (
        ba,
        bb,
        _,
        _,
    ):
        round_trip(ba, bb, 3)
    assert_only_ciphertext(kafka_bootstrap, names.inbound_topic(b), 3)
    for m in sealed_records(kafka_bootstrap, names.inbound_topic(b)):
        seal = Seal.from_header(dict(m.headers())[H_SEALED])
        assert seal.session is not None and seal.session.initiator is None


def test_changed_foreign_and_replayed_sealed_records_are_refused_or_dropped(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with secured(kafka_bootstrap, tmp_path, a, b, binding=binding_yaml()) as (ba, bb, dispatcher, _):
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(h, REQUEST, {"i": 0, "mark": MARK})
        assert len(receive_all(bb, 1)) == 1
        real = sealed_records(kafka_bootstrap, names.inbound_topic(b))[0]
        master = Keys().private(a)  # the sending namespace's own key: only the seal can refuse these
        p = clients.idempotent_producer(kafka_bootstrap)
        inbound = names.inbound_topic(b)

        def inject(value: bytes, headers: list) -> None:
            hs = [(n, v) for n, v in headers if n not in ("kb.sig", "kb.sig.at")]
            p.produce(inbound, key=real.key(), value=value, headers=sign(master, real.key(), value, hs, time.time()))

        changed = bytearray(real.value())
        changed[-1] ^= 1
        inject(bytes(changed), real.headers())  # a body changed on the way
        seal = Seal.from_header(dict(real.headers())[H_SEALED])
        stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        foreign = Seal(seal.epoch, Session(ds.wrap(os.urandom(32), stranger.public_key()), "00" * 32))
        inject(real.value(), [(n, foreign.to_header() if n == H_SEALED else v) for n, v in real.headers()])
        p.produce(inbound, key=real.key(), value=real.value(), headers=real.headers())  # replayed as it was
        p.flush(10)
        wait_for(lambda: dispatcher.kept >= 2, 30, "the dispatcher to refuse the changed and foreign records")
        assert bb.receive("Q", top=10, wait=3) == []
        ba.send(h, REQUEST, {"i": 1, "mark": MARK})  # the dialog goes on
        assert [m.message_sequence_number for m in receive_all(bb, 1)] == [1]
        assert dispatcher.kept == 2 and dispatcher.duplicates >= 1
    reasons = kept_reasons(kafka_bootstrap, b)
    assert sum("dialog security: the body or its headers were changed" in r for r in reasons) == 1, reasons
    assert sum("no certificate with a private key here" in r for r in reasons) == 1, reasons
    assert_only_ciphertext(kafka_bootstrap, names.deadletter_topic(b), 2)


def test_encryption_on_waits_for_a_binding_then_goes_out_sealed(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with secured(kafka_bootstrap, tmp_path, a, b, binding="") as (ba, bb, _, _):
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT, encryption=True)
        ba.send(h, REQUEST, {"i": 0, "mark": MARK})
        clear = ba.begin_dialog(CLIENT, SERVER, CONTRACT)  # ENCRYPTION = OFF and no binding: in clear
        ba.send(clear, REQUEST, {"i": 0, "clear": True})
        got = receive_all(bb, 1)
        assert orjson.loads(got[0].body) == {"i": 0, "clear": True}

        def waiting() -> list[dict]:
            return [
                r
                for r in transmission_rows(kafka_bootstrap, a)
                if "no remote service binding" in r["transmission_status"]
            ]

        wait_for(lambda: len(waiting()) == 1, 30, "the ENCRYPTION = ON message to wait with its status")
        assert bb.receive("Q", top=10, wait=2) == []
        write_catalogs(kafka_bootstrap, tmp_path, a, b, binding_yaml())
        got = receive_all(bb, 1, timeout=60)
        assert [orjson.loads(m.body)["mark"] for m in got] == [MARK]
    secured_records = [
        m for m in sealed_records(kafka_bootstrap, names.inbound_topic(b)) if dict(m.headers()).get(H_SEALED)
    ]
    assert len(secured_records) == 1 and MARK.encode() not in secured_records[0].value()


def test_a_dialog_in_flight_goes_on_across_a_master_key_rotation(kafka_bootstrap, namespace, tmp_path):
    """A's master key rotated between a dialog's messages (its keys directory is B's too, so B
    has A's new public keys at once): the requests after it arrive, signed by the new key and
    sealed under a session key derived from it, and B's replies under the old session still open
    at A with the retired key. Nothing is refused."""
    a, b = namespace + "a", namespace + "b"
    with secured(kafka_bootstrap, tmp_path, a, b, binding=binding_yaml()) as (ba, bb, dispatcher_b, _):
        conv = round_trip(ba, bb, 2)
        _, old, _ = Keys().rotate(a, grace=3600)
        h = handle_for(conv, "INITIATOR")
        with ba.transaction() as tx:
            for i in range(2, 4):
                tx.send(h, REQUEST, {"i": i, "mark": MARK})
        got = receive_all(bb, 2)
        assert [m.message_sequence_number for m in got] == [2, 3]
        with bb.transaction() as tx:  # B's endpoint keeps the session of the dialog's first message
            tx.send(handle_for(conv, "TARGET"), REPLY, {"reply": 9, "mark": MARK})
        assert [orjson.loads(m.body)["reply"] for m in receive_all(ba, 1)] == [9]
        assert dispatcher_b.kept == 0
    masters: dict[int, list[str | None]] = {}  # sequence number -> the master key of each copy sent
    for m in sealed_records(kafka_bootstrap, names.inbound_topic(b)):
        seal = Seal.from_header(dict(m.headers())[H_SEALED])
        seq = Envelope.from_headers(m.headers()).message_sequence_number
        masters.setdefault(seq, []).append(seal.session.master if seal.session else None)
    assert masters[0][0] == masters[1][0] == old  # sent before the rotation
    assert {k for s in (2, 3) for k in masters[s]} - {old} and old not in masters[2] + masters[3]
    replies = [
        Seal.from_header(dict(m.headers())[H_SEALED]) for m in sealed_records(kafka_bootstrap, names.inbound_topic(a))
    ]
    assert len(replies) >= 3 and {s.master for s in replies} == {old}
    assert kept_reasons(kafka_bootstrap, a) == [] and kept_reasons(kafka_bootstrap, b) == []


def test_a_service_that_takes_full_security_refuses_anonymous_and_clear_dialogs(kafka_bootstrap, namespace, tmp_path):
    """B's service takes full security only: an anonymous dialog (A's binding says ANONYMOUS =
    ON) comes back as Error -8494, and nothing reaches B's queue; so does one in clear once the
    binding is gone."""
    a, b = namespace + "a", namespace + "b"
    with secured(
        kafka_bootstrap, tmp_path, a, b, binding=binding_yaml(anonymous=True), client_cert=False, security="full"
    ) as (ba, bb, _, _):
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(h, REQUEST, {"i": 0, "mark": MARK})
        [m] = receive_all(ba, 1)
        assert m.message_type_name == ERROR and m.conversation_handle == h
        assert b"<Code>-8494</Code>" in m.body and b"full dialog security, and this one has anonymous" in m.body
        dropped = tmp_path / "drop.yaml"
        dropped.write_text("drop:\n  - {kind: remote-service-binding, name: ToServer}\n")
        apply_paths(kafka_bootstrap, a, [dropped])
        time.sleep(1.5)  # every process's catalog watcher sees the binding gone within about 0.5 s
        clear = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(clear, REQUEST, {"i": 0, "clear": True})
        [m] = receive_all(ba, 1)
        assert m.conversation_handle == clear and b"and this one has none" in m.body
        assert bb.receive("Q", top=10, wait=2) == []
