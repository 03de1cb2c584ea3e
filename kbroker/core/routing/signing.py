"""Who sent a routed message (pure logic): Ed25519 signatures over inbound records.

Kafka cannot say who wrote a record, and a principal of one cluster means nothing on another, so
a namespace's inbound topic cannot tell its senders apart by ACLs when routes cross clusters.
Each namespace signs what its transmitter sends with its master key (an Ed25519 private key,
kafka/routing/keys.py) and the far dispatcher checks the signature against the public key of
the namespace the record claims (`kb.from_broker_instance`), which it was given beforehand, as
Service Broker's dialog security checks the sender's certificate (docs/sources.md, item 147).

The signature covers the record's key, value and every header but its own, so a signed record
cannot be moved to another dialog direction, renumbered, re-declared (`kb.follows`) or changed.
`kb.sig.at` dates it: a copy replayed later than MAX_AGE is refused, so the dispatcher may forget
(tombstone) an ended dialog's acknowledgement after that long without a replay saving it again.
A retransmission is signed afresh, so a legitimate message is never too old for long.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.routing.transmission import ack_key

H_SIG = "kb.sig"  # base64 of the Ed25519 signature
H_SIG_AT = "kb.sig.at"  # epoch milliseconds of the signing
MAX_AGE = 86400.0  # a day: how long a signature stays good (an ended direction's ack is kept twice that)
_CONTEXT = b"kbroker-routed-record-1"

RawHeaders = Sequence[tuple[str, bytes | None]]


class RecordRefused(MalformedRecord):
    """An inbound record kbroker will not deliver: `reason` says why (malformed, or its sender
    could not be verified); `sender` is the namespace it claimed, if it named one."""

    def __init__(self, reason: str, sender: str | None = None):
        super().__init__(reason)
        self.reason, self.sender = reason, sender


def _field(data: bytes | None) -> bytes:
    if data is None:
        return b"\xff\xff\xff\xff"
    return len(data).to_bytes(4, "big") + data


def payload(key: bytes | None, value: bytes | None, headers: RawHeaders) -> bytes:
    """The bytes a signature covers: the record but its signature header, each field
    length-prefixed (no two records share a payload)."""
    parts = [_CONTEXT, _field(key), _field(value)]
    for name, v in headers:
        if name != H_SIG:
            parts += [_field(name.encode()), _field(v)]
    return b"".join(parts)


def sign(
    private_key: Ed25519PrivateKey, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]], now: float
) -> list[tuple[str, bytes]]:
    """`headers` with the signing time and the signature added (any earlier ones replaced)."""
    hs = [(n, v) for n, v in headers if n not in (H_SIG, H_SIG_AT)] + [(H_SIG_AT, str(int(now * 1000)).encode())]
    sig = private_key.sign(payload(key, value, hs))
    return hs + [(H_SIG, base64.b64encode(sig))]


def _header(headers: RawHeaders, name: str) -> bytes:
    found = [v for n, v in headers if n == name]
    if len(found) != 1:
        raise RecordRefused(f"{len(found)} {name} headers")
    return found[0] or b""


def verified(
    key: bytes | None,
    value: bytes | None,
    headers: RawHeaders | None,
    *,
    public_keys: Callable[[str], Sequence[Ed25519PublicKey]],
    now: float,
    max_age: float = MAX_AGE,
) -> Envelope:
    """The envelope of an inbound record whose sender is proven, or RecordRefused saying why:
    not a kbroker message, no sending namespace, keyed for another direction, unsigned, signed
    too long ago, by an unknown namespace or by a key that is not one the namespace it names has
    here (`public_keys`: those accepted now). (A message addressed to another namespace is the
    dispatcher's to forward or wait.)"""
    hs = list(headers or ())
    try:
        env = Envelope.from_headers(hs)
    except MalformedRecord as exc:
        raise RecordRefused(f"malformed: {exc}") from None
    sender = env.from_broker
    if not sender:
        raise RecordRefused("no sending namespace (kb.from_broker_instance)")
    if "|" in env.conversation_id:
        raise RecordRefused("a conversation id with '|' (the acks topic's separator)", sender)
    if key != ack_key(sender, env.conversation_id, env.to_side).encode():
        raise RecordRefused("its key is not its dialog direction's", sender)
    try:
        sig = base64.b64decode(_header(hs, H_SIG), validate=True)
        at = int(_header(hs, H_SIG_AT)) / 1000.0
    except RecordRefused as exc:
        raise RecordRefused(f"unsigned: {exc}", sender) from None
    except (binascii.Error, ValueError):
        raise RecordRefused("unreadable signature headers", sender) from None
    if abs(now - at) > max_age:
        raise RecordRefused(f"signed {now - at:.0f} s from now, beyond {max_age:.0f} s (a replay?)", sender)
    pubs = public_keys(sender)
    if not pubs:
        raise RecordRefused(f"no public key of namespace {sender!r} here: its messages are not accepted", sender)
    signed = payload(key, value, hs)
    for pub in pubs:  # the current key first; a rotated-out one during its grace period
        try:
            pub.verify(sig, signed)
            return env
        except InvalidSignature:
            continue
    raise RecordRefused(f"the signature is not that of namespace {sender!r}", sender)
