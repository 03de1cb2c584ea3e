"""Certificates of services, as files in config.keys_dir()/certificates (CREATE CERTIFICATE).

`<name>.crt` is the certificate (PEM X.509, RSA 2048), `<name>.json` its owner (the database
principal that owns it, as in Service Broker) and whether it is ACTIVE FOR BEGIN_DIALOG, and
`<name>.key` its private key (PKCS#8 PEM, mode 0600) when the certificate is this machine's own
(made by `create`); an imported one has none. Private keys are never written to a topic, a log
or an export; one whose file others may read is refused. A dialog's session key is wrapped for
the far service's certificate and, under full security, signed with the local service's
(core/security/dialog_security.py).
"""

from __future__ import annotations

import datetime
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from kbroker import config
from kbroker.errors import InvalidArgumentError

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
DEFAULT_DAYS = 365


class CertificateError(InvalidArgumentError):
    """A certificate that cannot be made, read or used: the message names it and why."""


@dataclass(frozen=True)
class Certificate:
    """sys.certificates' row of one certificate."""

    name: str
    owner: str
    subject: str
    thumbprint: str  # SHA-256 of the DER certificate, hex
    start_date: datetime.datetime
    expiry_date: datetime.datetime
    has_private_key: bool
    begin_dialog: bool
    public_key: rsa.RSAPublicKey

    def valid(self, now: datetime.datetime) -> bool:
        return self.start_date <= now <= self.expiry_date

    def row(self) -> dict[str, object]:
        return {
            "name": self.name,
            "principal": self.owner,
            "subject": self.subject,
            "thumbprint": self.thumbprint,
            "start_date": self.start_date.isoformat(),
            "expiry_date": self.expiry_date.isoformat(),
            "pvt_key_encryption_type_desc": "NO_PRIVATE_KEY" if not self.has_private_key else "UNENCRYPTED",
            "is_active_for_begin_dialog": self.begin_dialog,
        }


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _named(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise CertificateError(
            f"certificate name {name!r}: use up to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
        )
    return name


class CertificateStore:
    """The certificates in one directory; read again when their files change."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or config.keys_dir() / "certificates"
        self._cache: dict[str, tuple[tuple[float, float], Certificate | None]] = {}
        self._private: dict[str, tuple[float, rsa.RSAPrivateKey]] = {}

    # --- commands ------------------------------------------------------------------------------

    def create(
        self, name: str, owner: str, subject: str, *, days: int = DEFAULT_DAYS, begin_dialog: bool = True
    ) -> Certificate:
        """CREATE CERTIFICATE name AUTHORIZATION owner WITH SUBJECT = subject: a new key pair."""
        _named(name)
        if (self.directory / f"{name}.crt").exists():
            raise CertificateError(f"certificate {name!r} already exists in {self.directory}")
        if days < 1:
            raise CertificateError(f"certificate {name!r}: its validity must be at least a day, not {days}")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subj = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        now = utcnow()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subj)
            .issuer_name(subj)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .sign(key, hashes.SHA256())
        )
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._write(f"{name}.key", pem, private=True)
        self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        self._write(f"{name}.json", orjson.dumps({"owner": owner, "begin_dialog": begin_dialog}))
        return self._load(name, force=True)  # type: ignore[return-value]

    def import_(self, name: str, owner: str, pem: bytes, *, begin_dialog: bool = True) -> Certificate:
        """CREATE CERTIFICATE name AUTHORIZATION owner FROM FILE: another service's certificate."""
        _named(name)
        if (self.directory / f"{name}.crt").exists():
            raise CertificateError(f"certificate {name!r} already exists in {self.directory}")
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError as exc:
            raise CertificateError(f"certificate {name!r}: not a PEM X.509 certificate ({exc})") from None
        if not isinstance(cert.public_key(), rsa.RSAPublicKey):
            raise CertificateError(f"certificate {name!r}: kbroker's dialog security takes RSA certificates only")
        if any(c.thumbprint == _thumbprint(cert) for c in self.certificates()):
            raise CertificateError(f"certificate {name!r}: the same certificate is already here")
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM))
        self._write(f"{name}.json", orjson.dumps({"owner": owner, "begin_dialog": begin_dialog}))
        return self._load(name, force=True)  # type: ignore[return-value]

    def export(self, name: str) -> bytes:
        """BACKUP CERTIFICATE name TO FILE, without its private key: the PEM to give the far side."""
        if self._load(_named(name)) is None:
            raise CertificateError(f"no certificate {name!r} in {self.directory}")
        return (self.directory / f"{name}.crt").read_bytes()

    def drop(self, name: str) -> None:
        """DROP CERTIFICATE name."""
        if self._load(_named(name)) is None:
            raise CertificateError(f"no certificate {name!r} in {self.directory}")
        for suffix in (".key", ".crt", ".json"):
            (self.directory / f"{name}{suffix}").unlink(missing_ok=True)
        self._cache.pop(name, None)

    # --- look-ups ------------------------------------------------------------------------------

    def certificates(self) -> list[Certificate]:
        try:
            names = sorted(p.stem for p in self.directory.glob("*.crt"))
        except OSError:
            return []
        return [c for c in (self._load(n) for n in names) if c is not None]

    def owned_by(self, owner: str, now: datetime.datetime, *, private: bool = False) -> Certificate | None:
        """The certificate Service Broker picks for a user: valid now, active for BEGIN DIALOG,
        the latest expiry first (`private`: only one whose private key is here)."""
        found = [
            c
            for c in self.certificates()
            if c.owner == owner and c.begin_dialog and c.valid(now) and (c.has_private_key or not private)
        ]
        return max(found, key=lambda c: (c.expiry_date, c.name), default=None)

    def by_thumbprint(self, thumbprint: str) -> Certificate | None:
        return next((c for c in self.certificates() if c.thumbprint == thumbprint), None)

    def private_key(self, cert: Certificate) -> rsa.RSAPrivateKey:
        """The private key of one of this machine's certificates; refused when others may read it."""
        path = self.directory / f"{cert.name}.key"
        try:
            st = path.stat()
        except OSError:
            raise CertificateError(f"certificate {cert.name!r} has no private key here ({path})") from None
        if st.st_mode & 0o077:
            raise CertificateError(
                f"the private key of certificate {cert.name!r} ({path}) may be read by others "
                f"(mode {stat.filemode(st.st_mode)}): chmod 600 it"
            )
        cached = self._private.get(cert.name)
        if cached is not None and cached[0] == st.st_mtime:
            return cached[1]
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise CertificateError(f"cannot read the private key of certificate {cert.name!r}: {exc}") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise CertificateError(f"the private key of certificate {cert.name!r} is not an RSA key")
        self._private[cert.name] = (st.st_mtime, key)
        return key

    # --- files ---------------------------------------------------------------------------------

    def _write(self, filename: str, data: bytes, *, private: bool = False) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".new-")  # mode 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if not private:
            os.chmod(tmp, 0o644)
        os.replace(tmp, self.directory / filename)

    def _load(self, name: str, force: bool = False) -> Certificate | None:
        crt, meta = self.directory / f"{name}.crt", self.directory / f"{name}.json"
        try:
            stamp = (crt.stat().st_mtime, meta.stat().st_mtime)
        except OSError:
            return None
        cached = self._cache.get(name)
        if cached is not None and cached[0] == stamp and not force:
            return cached[1]
        found: Certificate | None
        try:
            cert = x509.load_pem_x509_certificate(crt.read_bytes())
            info = orjson.loads(meta.read_bytes())
            key = cert.public_key()
            if not isinstance(key, rsa.RSAPublicKey) or not isinstance(info.get("owner"), str):
                raise ValueError("not an RSA certificate with an owner")
            cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            found = Certificate(
                name,
                info["owner"],
                str(cn[0].value) if cn else cert.subject.rfc4514_string(),
                _thumbprint(cert),
                cert.not_valid_before_utc,
                cert.not_valid_after_utc,
                (self.directory / f"{name}.key").exists(),
                bool(info.get("begin_dialog", True)),
                key,
            )
        except (OSError, ValueError, orjson.JSONDecodeError, AttributeError):
            found = None  # an unreadable certificate is no certificate
        self._cache[name] = (stamp, found)
        return found


def _thumbprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()
