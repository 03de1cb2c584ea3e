"""Dialog security at the namespace's edges: the transmitter seals what leaves, the dispatcher
opens what arrives (the rules are core/security/dialog_security.py's).

Within one namespace nothing is sealed, as Service Broker never encrypts within an instance; the
transmission topic holds the namespace's own outgoing records, as sys.transmission_queue does.
Sealed bodies cross the far namespace's inbound topic, its forwarders and, when refused, its
dead-letter topic; the far dispatcher opens them before saving to the queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from kbroker.core.catalog.models import Catalog
from kbroker.core.dialogs.envelope import H_ENCRYPTION, H_SESSION, Envelope, header_text
from kbroker.core.records import Header
from kbroker.core.security import dialog_security as ds
from kbroker.core.security.dialog_security import H_LOCAL, H_SEALED, Seal, SealRefused, Security, Session
from kbroker.kafka.routing.keys import Keys
from kbroker.kafka.security.certificates import Certificate, CertificateError, CertificateStore, utcnow

K = TypeVar("K")
V = TypeVar("V")
CACHED = 10_000  # session keys a process keeps (memory stays bounded whatever the dialogs)
LOCAL_ONLY = (H_SESSION, H_ENCRYPTION, H_SEALED, H_LOCAL)  # never sent: the far side learns them sealed


class _Lru(Generic[K, V]):
    def __init__(self, size: int = CACHED):
        self._d: OrderedDict[K, V] = OrderedDict()
        self._size = size

    def get(self, key: K, make: Callable[[], V]) -> V:
        try:
            self._d.move_to_end(key)
            return self._d[key]
        except KeyError:
            value = self._d[key] = make()
            if len(self._d) > self._size:
                self._d.popitem(last=False)
            return value


def _header(headers: Sequence[Header], name: str) -> str | None:
    found = [v for n, v in headers if n == name]
    return header_text(found[-1]) if found else None


class Sealer:
    """Seals the records the transmitter sends, per the dialog's security."""

    def __init__(self, namespace: str, master: Callable[[], tuple[str, bytes]], store: CertificateStore):
        """`master`: the id and secret of the namespace's current master key (keys.py)."""
        self.namespace, self._master, self.store = namespace, master, store
        self._sessions: _Lru[tuple[str, str, str | None, str], Session] = _Lru()
        self._roots: _Lru[bytes, bytes] = _Lru()

    def seal(
        self, value: bytes | None, headers: list[Header], catalog: Catalog
    ) -> tuple[bytes | None, list[Header], Security] | str:
        """(value, headers, security) to send, or why the message waits (its status text)."""
        env = Envelope.from_headers(headers)
        now = utcnow()
        if env.to_side == "TARGET":
            session, root = self._initiator_session(env, headers, catalog, now)
            if isinstance(session, str):
                return session
            if session is None:
                return value, [(n, v) for n, v in headers if n not in LOCAL_ONLY], Security.NONE
            master = None
        else:
            text = _header(headers, H_SESSION)
            if text is None:  # the dialog's first message came in clear: so do its replies
                return value, [(n, v) for n, v in headers if n not in LOCAL_ONLY], Security.NONE
            try:
                received = Session.from_text(text)
                root = self._open_session(received)
            except (SealRefused, CertificateError) as exc:
                return f"Dialog security is unavailable for this conversation: {exc}"
            session, master = None, received.master
        epoch = ds.epoch_of(env.message_sequence_number, now.timestamp())
        # An empty body is sealed too, so a far side can tell a removed body from an empty one.
        body = ds.seal_body(ds.direction_key(root, env.to_side, epoch), value or b"", ds.associated_data(env, epoch))
        seal = Seal(epoch, session, master)
        hs = [(n, v) for n, v in headers if n not in LOCAL_ONLY] + [(H_SEALED, seal.to_header())]
        kind = Security.FULL if session is None or session.initiator is not None else Security.ANONYMOUS
        return body, hs, kind

    def _initiator_session(
        self, env: Envelope, headers: list[Header], catalog: Catalog, now: object
    ) -> tuple[Session | str | None, bytes]:
        binding = catalog.binding_for(env.to_service_name)
        service = catalog.services.get(env.from_service_name)
        owner = service.owner if service is not None else "dbo"
        mine = self.store.owned_by(owner, utcnow(), private=True)
        decided = ds.dialog_security(
            binding is not None,
            binding is not None and binding.anonymous,
            mine is not None,
            _header(headers, H_ENCRYPTION) == "1",
        )
        if isinstance(decided, str) or decided is Security.NONE:
            return (decided if isinstance(decided, str) else None), b""
        assert binding is not None
        far = self.store.owned_by(binding.user, utcnow())
        if far is None:
            return (
                f"Dialog security is unavailable for this conversation because user '{binding.user}' "
                f"(remote service binding '{binding.name}') owns no valid certificate for service "
                f"'{env.to_service_name}'. Import the far service's certificate for that user."
            ), b""
        master, secret = self._master()
        root = ds.root_key(secret, self.namespace, env.conversation_id)
        signer = mine if decided is Security.FULL else None
        # Per master key too: after a rotation the dialog's next messages bring a key derived
        # from the new one (its target's replies name which, Seal.master).
        key = (env.conversation_id, far.thumbprint, None if signer is None else signer.thumbprint, master)
        return self._sessions.get(key, lambda: self._new_session(root, master, env, far, signer)), root

    def _new_session(
        self, root: bytes, master: str, env: Envelope, far: Certificate, signer: Certificate | None
    ) -> Session:
        wrapped = ds.wrap(root, far.public_key)
        if signer is None:
            return Session(wrapped, far.thumbprint, master=master)
        signature = ds.sign_key(self.store.private_key(signer), ds.key_statement(wrapped, env, far.thumbprint))
        return Session(wrapped, far.thumbprint, signer.thumbprint, signature, master)

    def _open_session(self, session: Session) -> bytes:
        return self._roots.get(session.wrapped, lambda: _unwrap(self.store, session))


def _unwrap(store: CertificateStore, session: Session) -> bytes:
    cert = store.by_thumbprint(session.target)
    if cert is None or not cert.has_private_key:
        raise SealRefused(f"no certificate with a private key here has thumbprint {session.target}")
    return ds.unwrap(session.wrapped, store.private_key(cert))


class Opener:
    """Opens the sealed records the dispatcher saves; refuses (SealRefused) what it cannot open."""

    def __init__(self, namespace: str, master: Callable[[str | None], bytes | None], store: CertificateStore):
        """`master`: the secret of the namespace's master key with that id (the current one for
        None), None when it is not here (keys.Keys.secret)."""
        self.namespace, self._master, self.store = namespace, master, store
        self._roots: _Lru[tuple[bytes, str | None, bytes | None], bytes] = _Lru()

    def open(self, env: Envelope, value: bytes, headers: list[Header]) -> tuple[bytes, list[Header]]:
        """(clear value, headers to save) of one inbound record that passed its namespace check."""
        raw = [v for n, v in headers if n == H_SEALED]
        if not raw:
            return value, [(n, v) for n, v in headers if n not in LOCAL_ONLY]
        if len(raw) > 1:
            raise SealRefused(f"{len(raw)} {H_SEALED} headers")
        seal = Seal.from_header(raw[0])
        kept = [(n, v) for n, v in headers if n not in LOCAL_ONLY]
        if env.to_side == "TARGET":
            if seal.session is None:
                raise SealRefused("a sealed message to the target without its session key")
            root = self._target_root(env, seal.session)
            kept.append((H_SESSION, seal.session.to_text().encode()))
        else:
            if seal.session is not None:
                raise SealRefused("a reply that carries a session key")
            secret = self._master(seal.master)
            if secret is None:
                raise SealRefused(f"sealed under master key {seal.master} of this namespace, which is not here")
            root = ds.root_key(secret, self.namespace, env.conversation_id)
        aad = ds.associated_data(env, seal.epoch)
        return ds.open_body(ds.direction_key(root, env.to_side, seal.epoch), value, aad), kept

    def _target_root(self, env: Envelope, session: Session) -> bytes:
        def make() -> bytes:
            try:
                root = _unwrap(self.store, session)
                if session.initiator is not None and session.signature is not None:
                    signer = self.store.by_thumbprint(session.initiator)
                    if signer is None or not signer.valid(utcnow()):
                        raise SealRefused(
                            f"the session key is signed by certificate {session.initiator}, "
                            "which is not here or not valid now (full security needs the initiator's)"
                        )
                    statement = ds.key_statement(session.wrapped, env, session.target)
                    ds.check_key_signature(signer.public_key, session.signature, statement)
            except CertificateError as exc:
                raise SealRefused(str(exc)) from None
            return root

        # The signature covers the dialog, so a key is remembered per dialog and signer.
        key = (session.wrapped + env.conversation_id.encode(), session.initiator, session.signature)
        return self._roots.get(key, make)


class TransmissionSeal:
    """Seals a routed dialog's records at SEND for its namespace's transmission topic, and opens
    them in the transmitter: with a key from the namespace's master key, when the sending process
    holds that key (Keys.held); else they are written in clear."""

    def __init__(self, namespace: str, keys: Keys):
        self.namespace, self._keys = namespace, keys
        self._derived: _Lru[tuple[str, str], bytes] = _Lru()

    def _key(self, master: str, secret: bytes, conversation_id: str) -> bytes:
        return self._derived.get(
            (master, conversation_id), lambda: ds.transmission_key(secret, self.namespace, conversation_id)
        )

    def seal(self, env: Envelope, body: bytes) -> tuple[bytes, Header] | None:
        """(sealed body, its header) of one transmission record, None when no key is held here."""
        held = self._keys.held(self.namespace)
        if held is None:
            return None
        master, secret = held
        key = self._key(master, secret, env.conversation_id)
        return ds.seal_body(key, body, ds.associated_data(env, "transmission")), (H_LOCAL, master.encode())

    def open(self, value: bytes | None, headers: list[Header]) -> tuple[bytes | None, list[Header]]:
        """A transmission record's clear body and headers; SealRefused when it cannot be opened."""
        master = _header(headers, H_LOCAL)
        if master is None:
            return value, headers
        secret = self._keys.secret(self.namespace, master)
        if secret is None:
            raise SealRefused(f"sealed at SEND under master key {master} of this namespace, which is not here")
        env = Envelope.from_headers(headers)
        clear = ds.open_transmission(self._key(master, secret, env.conversation_id), env, value or b"")
        return clear, [(n, v) for n, v in headers if n != H_LOCAL]
