"""The secured embedded broker's certificates: a private CA (`CN=kbroker CA`), the broker's
certificate (`CN=kbroker-broker`, also its client certificate towards the controller and the
inter-broker listener) and a client certificate per user (`CN=<name>`, which the broker's
principal mapping turns into `User:<name>`).

Keys are EC P-256 in unencrypted PKCS#8 PEM, the one private-key form Kafka's PEM key store
reads; the files holding them are private to their owner (0600) instead. Everything but
`write_private` is pure: it returns PEM bytes."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "kbroker CA"
BROKER_NAME = "kbroker-broker"
VALID_FOR = timedelta(days=730)
# Not valid from this instant but a day before: a clock a little behind still accepts it.
_BACKDATE = timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    key: bytes
    cert: bytes

    def chain(self, ca: "Issued") -> bytes:
        """Key, certificate and CA certificate in one PEM: a Kafka PEM key store's file."""
        return self.key + self.cert + ca.cert


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8 ("BEGIN PRIVATE KEY"): Kafka's PEM key store refuses the SEC1 "EC PRIVATE KEY" form.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.now(timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def new_ca() -> Issued:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        _builder(CA_NAME, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(_pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def issue(ca: Issued, name: str, *, server: bool = False) -> Issued:
    """A leaf certificate `CN=<name>` signed by `ca`: a client certificate, or with `server` also
    a server one for localhost and 127.0.0.1 (clients check the address they dialled against its
    names, and an IP address matches an IP entry only)."""
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # what new_ca makes
    key = _new_key()
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        _builder(name, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(_pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def write_private(path: Path, data: bytes | str) -> None:
    """Write `path` readable by its owner only (0600), replacing it in one step: it holds a key
    or a password, and a reader never sees it half written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner may enter (0700), created when missing."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)  # mkdir's mode is masked by the umask, and an existing dir keeps its own
    return path


def ensure(secure: Path, user: str | None = None) -> Path:
    """Write into `secure` what is missing of the CA (ca.pem, ca.key) and the broker's key store
    (broker.pem), or with `user` that user's key store (users/<user>.pem); existing files are
    kept, so a restart presents the same certificates. The key store's path."""
    private_dir(secure)
    ca_pem, ca_key = secure / "ca.pem", secure / "ca.key"
    if not (ca_pem.exists() and ca_key.exists()):
        ca = new_ca()
        write_private(ca_key, ca.key)
        write_private(ca_pem, ca.cert)
        # Key stores signed by a CA that is gone would be refused: issue them again.
        for old in [secure / "broker.pem", *(secure / "users").glob("*.pem")]:
            old.unlink(missing_ok=True)
    ca = Issued(ca_key.read_bytes(), ca_pem.read_bytes())
    store = secure / "broker.pem" if user is None else private_dir(secure / "users") / f"{user}.pem"
    if not store.exists():
        write_private(store, issue(ca, user or BROKER_NAME, server=user is None).chain(ca))
    return store
