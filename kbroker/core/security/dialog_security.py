"""Dialog security (pure logic): which security a routed dialog gets, its session key, and the
sealing of its bodies with an AEAD.

A dialog's root key is derived from the initiating namespace's master key and the dialog id, so
every process of that namespace (transmitters that send, dispatchers that receive the replies)
knows it without storing it. The initiator's messages carry it wrapped (RSA-OAEP) for the far
service's certificate, and, under full security, signed by the initiating service's certificate;
the target keeps the wrapped key with its endpoint (`kb.sec.session`) and seals its replies with
it. Each direction and epoch has its own key (HKDF of the root), so a direction's key is renewed
every EPOCH_MESSAGES messages and every EPOCH_SECONDS without a new exchange. Bodies are sealed
with AES-256-GCM; the associated data binds the dialog, direction, sequence number, message id,
type and both services, so a sealed body cannot be moved to another message. Namespace
signatures (core/routing/signing.py) still cover the whole record.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from enum import Enum

import orjson
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kbroker.core.dialogs.envelope import Envelope, MalformedRecord

H_SEALED = "kb.sec"  # on a sealed routed record: how to open it (Seal.to_header)
# On a transmission record sealed at SEND: the id of the namespace master key it was sealed under.
H_LOCAL = "kb.sec.local"
EPOCH_MESSAGES = 1 << 20  # a direction's key changes every this many sequence numbers
EPOCH_SECONDS = 86400  # and every day
_ROOT_INFO = b"kbroker-dialog-root-1"
_AAD_CONTEXT = b"kbroker-dialog-body-1"
_KEY_SIGNED = b"kbroker-dialog-key-1"
_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


class Security(Enum):
    """sys.conversation_endpoints' security of a routed dialog."""

    NONE = "none"
    ANONYMOUS = "anonymous"
    FULL = "full"


class SealRefused(MalformedRecord):
    """A sealed record that cannot be opened here: `reason` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def dialog_security(bound: bool, anonymous: bool, owner_has_certificate: bool, encryption: bool) -> Security | str:
    """The security an initiator's dialog gets, or why it cannot go out yet (Service Broker's
    table): a binding for the target service gives anonymous security when it says ANONYMOUS = ON,
    full security when the service's owner has a certificate, else the dialog waits; with no
    binding, ENCRYPTION = ON waits and OFF sends in clear."""
    if bound:
        if anonymous:
            return Security.ANONYMOUS
        if owner_has_certificate:
            return Security.FULL
        return (
            "Dialog security is unavailable for this conversation because there is no security "
            "certificate bound to the owner of the initiating service. Create a certificate for "
            "that user, or set ANONYMOUS = ON on the remote service binding."
        )
    if encryption:
        return (
            "Dialog security is unavailable for this conversation because there is no remote "
            "service binding for the target service. Create a remote service binding, or specify "
            "ENCRYPTION = OFF when beginning the conversation."
        )
    return Security.NONE


def root_key(master: bytes, namespace: str, conversation_id: str) -> bytes:
    """The dialog's root key, from its initiating namespace's master secret."""
    info = _ROOT_INFO + b"\0" + namespace.encode() + b"\0" + conversation_id.encode()
    return HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(master)


def epoch_of(sequence: int, enqueued: float) -> str:
    """The key epoch a message is sealed in: its sender's choice, carried in the seal."""
    return f"{max(sequence, 0) // EPOCH_MESSAGES}.{int(enqueued) // EPOCH_SECONDS}"


def direction_key(root: bytes, to_side: str, epoch: str) -> bytes:
    info = b"kbroker-dialog-direction-1\0" + to_side.encode() + b"\0" + epoch.encode()
    return HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(root)


def _field(data: str) -> bytes:
    raw = data.encode()
    return len(raw).to_bytes(4, "big") + raw


def associated_data(env: Envelope, epoch: str) -> bytes:
    """What a sealed body is bound to: its dialog, direction, place and kind."""
    return _AAD_CONTEXT + b"".join(
        _field(x)
        for x in (
            env.conversation_id,
            env.to_side,
            str(env.message_sequence_number),
            env.message_id,
            env.message_type_name,
            env.service_contract_name,
            env.from_service_name,
            env.to_service_name,
            env.from_broker or "",
            epoch,
        )
    )


def seal_body(key: bytes, body: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, body, aad)


def open_body(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    if len(sealed) < 12 + 16:
        raise SealRefused("a sealed body shorter than its nonce and tag")
    try:
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], aad)
    except InvalidTag:
        raise SealRefused("the body or its headers were changed, or it was sealed with another key") from None


def wrap(root: bytes, certificate_key: rsa.RSAPublicKey) -> bytes:
    return certificate_key.encrypt(root, _OAEP)


def unwrap(wrapped: bytes, private_key: rsa.RSAPrivateKey) -> bytes:
    try:
        root = private_key.decrypt(wrapped, _OAEP)
    except ValueError:
        raise SealRefused("the session key is not for this service's certificate") from None
    if len(root) != 32:
        raise SealRefused("a session key of the wrong length")
    return root


def key_statement(wrapped: bytes, env: Envelope, target_thumbprint: str) -> bytes:
    """What the initiating service's certificate signs under full security: this session key, for
    this dialog, from this namespace and service, to this target's certificate."""
    return _KEY_SIGNED + b"".join(
        _field(x)
        for x in (
            base64.b64encode(wrapped).decode(),
            env.conversation_id,
            env.from_broker or "",
            env.from_service_name,
            env.to_service_name,
            target_thumbprint,
        )
    )


def sign_key(private_key: rsa.RSAPrivateKey, statement: bytes) -> bytes:
    return private_key.sign(statement, _PSS, hashes.SHA256())


def check_key_signature(public_key: rsa.RSAPublicKey, signature: bytes, statement: bytes) -> None:
    try:
        public_key.verify(signature, statement, _PSS, hashes.SHA256())
    except InvalidSignature:
        raise SealRefused("the session key's signature is not that of the certificate it names") from None


@dataclass(frozen=True)
class Session:
    """A dialog's session key as the initiator sends it: wrapped for the target's certificate
    (`target`, its thumbprint) and, under full security, signed by `initiator`'s certificate;
    `master` names the initiating namespace's master key it was derived from (the target's
    replies name it back, so the initiator opens them after a key rotation too)."""

    wrapped: bytes
    target: str
    initiator: str | None = None
    signature: bytes | None = None
    master: str | None = None

    def to_text(self) -> str:
        d: dict[str, str] = {"w": base64.b64encode(self.wrapped).decode(), "k": self.target}
        if self.initiator is not None and self.signature is not None:
            d |= {"f": self.initiator, "s": base64.b64encode(self.signature).decode()}
        if self.master is not None:
            d["m"] = self.master
        return orjson.dumps(d).decode()

    @classmethod
    def from_text(cls, text: str) -> "Session":
        try:
            d = orjson.loads(text)
            if not isinstance(d, dict) or not isinstance(d.get("w"), str) or not isinstance(d.get("k"), str):
                raise SealRefused("a session key without its wrapped key or certificate")
            signed = "f" in d or "s" in d
            if signed and not (isinstance(d.get("f"), str) and isinstance(d.get("s"), str)):
                raise SealRefused("a session key signature without its certificate")
            return cls(
                base64.b64decode(d["w"], validate=True),
                d["k"],
                d["f"] if signed else None,
                base64.b64decode(d["s"], validate=True) if signed else None,
                _master_id(d.get("m")),
            )
        except (orjson.JSONDecodeError, binascii.Error, ValueError) as exc:
            if isinstance(exc, SealRefused):
                raise
            raise SealRefused(f"an unreadable session key: {exc}") from None


@dataclass(frozen=True)
class Seal:
    """The `kb.sec` header of a sealed record: its key epoch, and the session key on the
    initiator's messages (a target's replies use the one its endpoint keeps, and name its
    `master` key back)."""

    epoch: str
    session: Session | None = None
    master: str | None = None

    def to_header(self) -> bytes:
        d: dict[str, object] = {"v": 1, "e": self.epoch}
        if self.session is not None:
            d["key"] = self.session.to_text()
        if self.master is not None:
            d["m"] = self.master
        return orjson.dumps(d)

    @classmethod
    def from_header(cls, raw: bytes | None) -> "Seal":
        try:
            d = orjson.loads(raw or b"")
        except orjson.JSONDecodeError:
            raise SealRefused(f"an unreadable {H_SEALED} header") from None
        if not isinstance(d, dict) or d.get("v") != 1 or not isinstance(d.get("e"), str) or len(d["e"]) > 40:
            raise SealRefused(f"a {H_SEALED} header of an unknown form")
        key = d.get("key")
        if key is not None and not isinstance(key, str):
            raise SealRefused(f"a {H_SEALED} header of an unknown form")
        return cls(d["e"], None if key is None else Session.from_text(key), _master_id(d.get("m")))


def _master_id(value: object) -> str | None:
    # A key id is hex (keys.key_id); anything else never names a key file.
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 64 or not all(c in "0123456789abcdef" for c in value):
        raise SealRefused("a master key id that is not one")
    return value


def received_security(headers: list[tuple[str, bytes]]) -> Security:
    """The dialog security a routed record that opened came with: full when its session key is
    signed, anonymous when not, none when it came in clear (a reply names no session: FULL)."""
    raw = [v for n, v in headers if n == H_SEALED]
    if not raw:
        return Security.NONE
    session = Seal.from_header(raw[0]).session
    return Security.ANONYMOUS if session is not None and session.initiator is None else Security.FULL


def transmission_key(secret: bytes, namespace: str, conversation_id: str) -> bytes:
    """The key a dialog's records are sealed with in their own namespace's transmission topic:
    from the namespace's master secret, so only its SDK processes and transmitters that hold it
    read them."""
    info = b"kbroker-transmission-1\0" + namespace.encode() + b"\0" + conversation_id.encode()
    return HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(secret)


def open_transmission(key: bytes, env: Envelope, sealed: bytes) -> bytes:
    """A transmission record's body, sealed at SEND (seal_body with transmission_key)."""
    return open_body(key, sealed, associated_data(env, "transmission"))
