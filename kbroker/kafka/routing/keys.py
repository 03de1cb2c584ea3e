"""Namespaces' routing keys, as files in config.keys_dir() (core/routing/signing.py says why).

`<ns>.key` is namespace ns's master key: its private Ed25519 key (PEM, PKCS#8, mode 0600), which
its transmitters sign with. It is made the first time a namespace transmits from a machine that
has none, with `<ns>.pub` beside it; every machine running ns's workers needs the same one, so
copy it before starting a second. `<ns>.pub` (PEM) is the public key of a namespace whose routed
messages are accepted here: copy it from the sender's machine, as Service Broker's certificates
are exchanged. A namespace with no `<ns>.pub` here cannot send here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kbroker import config
from kbroker.core.names import prefix
from kbroker.errors import InvalidArgumentError


class Keys:
    """The keys in one directory; public keys are read again when their file changes."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or config.keys_dir()
        self._public: dict[str, tuple[float, Ed25519PublicKey | None]] = {}

    def private(self, namespace: str) -> Ed25519PrivateKey:
        """Namespace's master key, made (with its public key) when there is none."""
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
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"cannot read the master key of namespace {namespace!r} ({path}): {exc}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidArgumentError(f"{path} is not an Ed25519 private key")
        return key

    def secret(self, namespace: str) -> bytes:
        """Namespace's master secret: its master key's raw bytes, which the session keys of the
        dialogs it begins are derived from (core/security/dialog_security.root_key)."""
        return self.private(namespace).private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def _create(self, namespace: str, path: Path) -> None:
        key = Ed25519PrivateKey.generate()
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".new-")  # mode 0600
        with os.fdopen(fd, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        try:
            os.link(tmp, path)  # another process made one first: keep theirs
        except FileExistsError:
            return
        finally:
            os.unlink(tmp)
        pub = self.directory / f"{namespace}.pub"
        if not pub.exists():
            pub.write_bytes(public_pem(key.public_key()))

    def public(self, namespace: str) -> Ed25519PublicKey | None:
        """The public key of `namespace`, None when none is here (or it is unreadable)."""
        try:
            prefix(namespace)
            path = self.directory / f"{namespace}.pub"
            mtime = path.stat().st_mtime
        except (ValueError, OSError):
            return None
        cached = self._public.get(namespace)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError):
            key = None
        found = key if isinstance(key, Ed25519PublicKey) else None
        self._public[namespace] = (mtime, found)
        return found


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
