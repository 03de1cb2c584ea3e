"""Trust and key material read into the PEM every client of kbroker takes: certificates re-encoded,
keys as unencrypted PKCS#8, PKCS#12 stores opened. Pure: reads the bytes it is given.
Apart from client_security.py, which decides which settings name the material, because this is
the cryptography of it, the same for every setting.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from kbroker.errors import InvalidArgumentError


def is_pem(data: bytes) -> bool:
    return b"-----BEGIN " in data[:4096]


def certificates(text: str, what: str) -> str:
    """The certificates in PEM `text`, re-encoded (so every client reads the same bytes)."""
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        raise InvalidArgumentError(f"{what}: no PEM certificate in it") from None
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def pkcs8(data: bytes, password: str | None, what: str) -> str:
    """The private key in PEM `data` as unencrypted PKCS#8 PEM (Java reads only PKCS#8)."""
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"{what}: no readable private key ({_why(exc)})") from None
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def pkcs12_key_store(data: bytes, password: str | None) -> tuple[str, str]:
    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError as exc:
        raise InvalidArgumentError(f"ssl.keystore.location: not a PKCS#12 store it can open ({_why(exc)})") from None
    if key is None or cert is None:
        raise InvalidArgumentError("ssl.keystore.location: the PKCS#12 store holds no key and certificate")
    chain = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in [cert, *extra])
    return chain, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def pkcs12_certificates(name: str, data: bytes, password: str | None) -> str:
    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as exc:
        raise InvalidArgumentError(f"{name}: not a PEM file or a PKCS#12 store it can open ({_why(exc)})") from None
    certs = [c.certificate for c in store.additional_certs] + ([store.cert.certificate] if store.cert else [])
    if not certs:
        raise InvalidArgumentError(f"{name}: the PKCS#12 store holds no certificate")
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def _why(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return text if "password" in text.lower() or len(text) < 120 else type(exc).__name__
