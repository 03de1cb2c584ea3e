"""Namespaces' routing keys, as files in config.keys_dir() (core/routing/signing.py says why).

`<ns>.key` is namespace ns's master key: its private Ed25519 key (PEM, PKCS#8, mode 0600), which
its transmitters sign with and the session keys of the dialogs it begins derive from. It is made
the first time a namespace transmits from a machine that has none, with `<ns>.pub` beside it;
every machine running ns's workers needs the same one, so copy it before starting a second.

`<ns>.pub` holds the public keys of a namespace whose routed messages are accepted here: copy it
from the sender's machine (`kbroker key export`), as Service Broker's certificates are
exchanged. It holds one PEM public key or several; a key after a line `# accepted until <ISO
time>` is accepted until then. A namespace with no `<ns>.pub` here cannot send here.

`rotate` makes a new master key: the old one moves to `retired/<ns>.<id>.key`, kept to open the
replies of dialogs begun under it, and `<ns>.pub` lists the new key and the old one with its
grace period, so a far side given the new file accepts records signed before and after."""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kbroker import config
from kbroker.core.names import prefix
from kbroker.errors import InvalidArgumentError

GRACE_SECONDS = 7 * 86400  # how long a rotated-out key still signs acceptably, by default
_BLOCK = re.compile(
    r"(?:^# accepted until (?P<until>\S+)\s*\n)?(?P<pem>-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----)",
    re.S | re.M,
)


def key_id(key: Ed25519PublicKey) -> str:
    """A master key's id: the first 16 hex digits of SHA-256 of its raw public key."""
    return hashlib.sha256(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()[:16]


@dataclass(frozen=True)
class Accepted:
    """One public key of a namespace's `.pub` file; `until` None: with no end."""

    key: Ed25519PublicKey
    until: datetime.datetime | None

    @property
    def id(self) -> str:
        return key_id(self.key)

    def accepted(self, now: datetime.datetime) -> bool:
        return self.until is None or now <= self.until


class Keys:
    """The keys in one directory; each file is read again when it changes."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or config.keys_dir()
        # Cached per file version (inode and mtime: a rotation replaces the file).
        self._public: dict[str, tuple[tuple[int, int], list[Accepted]]] = {}
        self._private: dict[Path, tuple[tuple[int, int], Ed25519PrivateKey]] = {}

    def private(self, namespace: str) -> Ed25519PrivateKey:
        """Namespace's current master key, made (with its public key) when there is none."""
        prefix(namespace)  # a namespace name, never a path
        path = self.directory / f"{namespace}.key"
        if not path.exists():
            try:
                self._create(namespace, path)
            except OSError as exc:
                raise InvalidArgumentError(
                    f"namespace {namespace!r} has no master key and none can be made in "
                    f"{self.directory} (KBROKER_KEYS_DIR): {exc.strerror or exc}"
                ) from None
        return self._read_private(path, f"the master key of namespace {namespace!r}")

    def _read_private(self, path: Path, what: str) -> Ed25519PrivateKey:
        try:
            st = path.stat()
            mtime = (st.st_ino, st.st_mtime_ns)
            cached = self._private.get(path)
            if cached is not None and cached[0] == mtime:
                return cached[1]
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"cannot read {what} ({path}): {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidArgumentError(f"{path} is not an Ed25519 private key")
        self._private[path] = (mtime, key)
        return key

    def held(self, namespace: str) -> tuple[str, bytes] | None:
        """The id and secret of `namespace`'s current master key if this machine holds one (never
        made here: an SDK process seals with it only when it shares the transmitters' key)."""
        prefix(namespace)
        if not (self.directory / f"{namespace}.key").exists():
            return None
        key = self.private(namespace)
        secret = key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return key_id(key.public_key()), secret

    def secret(self, namespace: str, master: str | None = None) -> bytes | None:
        """A master secret of `namespace` (its key's raw bytes, which the session keys of the
        dialogs it begins are derived from, core/security/dialog_security.root_key): the current
        one when `master` is None or its id, a retired one by id, None when that is not here."""
        current = self.private(namespace)
        if master is None or master == key_id(current.public_key()):
            key = current
        else:
            path = self.directory / "retired" / f"{namespace}.{master}.key"
            if not re.fullmatch(r"[0-9a-f]{16}", master) or not path.exists():
                return None
            key = self._read_private(path, f"retired master key {master} of namespace {namespace!r}")
        return key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def _create(self, namespace: str, path: Path) -> None:
        key = Ed25519PrivateKey.generate()
        if _link_new(self.directory, path, _private_pem(key)):
            pub = self.directory / f"{namespace}.pub"
            if not pub.exists():
                pub.write_bytes(public_pem(key.public_key()))

    def accepted(self, namespace: str) -> list[Accepted]:
        """Every public key of `namespace` in its `.pub` file (none when there is none or it is
        unreadable), expired ones too."""
        try:
            prefix(namespace)
            path = self.directory / f"{namespace}.pub"
            st = path.stat()
            mtime = (st.st_ino, st.st_mtime_ns)
        except (ValueError, OSError):
            return []
        cached = self._public.get(namespace)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            found = _parse_pub(path.read_text())
        except (OSError, ValueError):
            found = []
        self._public[namespace] = (mtime, found)
        return found

    def public(self, namespace: str) -> list[Ed25519PublicKey]:
        """The public keys of `namespace` accepted now (the newest first)."""
        now = datetime.datetime.now(datetime.UTC)
        return [a.key for a in self.accepted(namespace) if a.accepted(now)]

    def rotate(self, namespace: str, grace: float = GRACE_SECONDS) -> tuple[str, str, datetime.datetime]:
        """A new master key for `namespace`: (new id, old id, until when the old is accepted).
        The old key is retired (kept to open replies of the dialogs begun under it) and
        `<ns>.pub` lists the new key, then the old until `grace` s from now, then the keys it
        listed that are still accepted."""
        old = self.private(namespace)
        old_id = key_id(old.public_key())
        retired = self.directory / "retired"
        retired.mkdir(mode=0o700, exist_ok=True)
        _link_new(retired, retired / f"{namespace}.{old_id}.key", _private_pem(old))
        new = Ed25519PrivateKey.generate()
        now = datetime.datetime.now(datetime.UTC)
        until = now + datetime.timedelta(seconds=grace)
        kept = [a for a in self.accepted(namespace) if a.id != old_id and a.until is not None and a.accepted(now)]
        text = public_pem(new.public_key()).decode() + _block(Accepted(old.public_key(), until))
        text += "".join(_block(a) for a in kept)
        _replace(self.directory / f"{namespace}.pub", text.encode(), 0o644)
        _replace(self.directory / f"{namespace}.key", _private_pem(new), 0o600)
        return key_id(new.public_key()), old_id, until

    def export(self, namespace: str) -> str:
        """The `.pub` file to give the namespaces that `namespace` sends to."""
        self.private(namespace)  # makes the key pair when there is none
        return (self.directory / f"{namespace}.pub").read_text()

    def import_(self, namespace: str, text: str) -> list[Accepted]:
        """Accept `namespace`'s public keys (`kbroker key export`'s file) from now on."""
        prefix(namespace)
        try:
            found = _parse_pub(text)
        except ValueError as exc:
            raise InvalidArgumentError(f"the file given for namespace {namespace!r} has a bad key: {exc}") from None
        if not found:
            raise InvalidArgumentError(f"no Ed25519 public key in the file given for namespace {namespace!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        _replace(self.directory / f"{namespace}.pub", text.encode(), 0o644)
        return found

    def rows(self) -> list[dict[str, object]]:
        """Every key here: a namespace's master key (current or retired, with its private key)
        or a public key it accepts (with until when)."""
        found: list[dict[str, object]] = []
        for path in sorted(self.directory.glob("*.key")):
            key = self._read_private(path, f"the master key {path.name}")
            found.append({"namespace": path.stem, "id": key_id(key.public_key()), "kind": "master", "until": None})
        for path in sorted((self.directory / "retired").glob("*.key")):
            namespace, _, ident = path.stem.rpartition(".")
            found.append({"namespace": namespace, "id": ident, "kind": "retired master", "until": None})
        for path in sorted(self.directory.glob("*.pub")):
            for a in self.accepted(path.stem):
                until = None if a.until is None else a.until.isoformat(timespec="seconds")
                found.append({"namespace": path.stem, "id": a.id, "kind": "accepted", "until": until})
        return found


def _parse_pub(text: str) -> list[Accepted]:
    found = []
    for m in _BLOCK.finditer(text):
        key = serialization.load_pem_public_key(m["pem"].encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        until = datetime.datetime.fromisoformat(m["until"]) if m["until"] else None
        if until is not None and until.tzinfo is None:
            until = until.replace(tzinfo=datetime.UTC)
        found.append(Accepted(key, until))
    return found


def _block(a: Accepted) -> str:
    head = "" if a.until is None else f"# accepted until {a.until.isoformat(timespec='seconds')}\n"
    return head + public_pem(a.key).decode()


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _link_new(directory: Path, path: Path, data: bytes) -> bool:
    """Write `path` (mode 0600) unless it exists: False when another process made it first."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".new-")  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def _replace(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
