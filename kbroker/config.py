"""Where things are: the one rule for choosing a broker, the namespace, per-user directories.

The broker rule itself (explicit address, KBROKER_BOOTSTRAP, the embedded broker) is
kbroker.embedded.resolve_cluster: it needs to know where the embedded broker runs.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

# librdkafka's own log lines (retries while a broker starts, disconnects at shutdown) go to this
# logger, not to stderr, where they would break the CLI's one-line errors and JSON output.
KAFKA_LOG = logging.getLogger("kbroker.kafka")
KAFKA_LOG.addHandler(logging.NullHandler())

DEFAULT_NAMESPACE = "default"
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def cache_dir() -> Path:
    """Per-user cache: downloaded Kafka jars live here, shared by every data dir."""
    base = os.environ.get("KBROKER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kbroker"
    )
    return Path(base)


def default_data_dir() -> Path:
    """Where `kbroker broker start` keeps the embedded broker's log dirs and state file."""
    base = os.environ.get("KBROKER_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "kbroker", "broker"
    )
    return Path(base)


def profiles_dir() -> Path:
    """Where client profiles live: one `<name>.properties` per Kafka cluster that routes lead to
    (its bootstrap.servers and client settings), named by a route's `profile`."""
    base = os.environ.get("KBROKER_PROFILES_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "kbroker", "profiles"
    )
    return Path(base)


def keys_dir() -> Path:
    """Where namespaces' routing keys live: `<ns>.key`, the master key of a namespace whose
    workers run here (its private Ed25519 key), and `<ns>.pub`, the public key of each namespace
    whose routed messages are accepted here (kafka/routing/keys.py)."""
    base = os.environ.get("KBROKER_KEYS_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "kbroker", "keys"
    )
    return Path(base)


def namespace(explicit: str | None = None) -> str:
    ns = explicit or os.environ.get("KBROKER_NAMESPACE") or DEFAULT_NAMESPACE
    if not NAMESPACE_RE.fullmatch(ns):
        raise ValueError(f"namespace {ns!r} must be 1-40 characters of letters, digits, '_' or '-'")
    return ns


def web_token(file: str | os.PathLike[str] | None = None) -> str | None:
    """The token of the worker's HTTP API (core/security/web_access.py): the first non-blank line of `file`, else of
    the file KBROKER_WEB_TOKEN_FILE names (a Docker or Kubernetes secret), else KBROKER_WEB_TOKEN;
    None when none is set. The worker requires it of every request; the CLI sends it. Not a
    command-line value: it would show in every process listing."""
    path = file or os.environ.get("KBROKER_WEB_TOKEN_FILE")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the web token file {os.fspath(path)}: {exc}") from None
        token = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if not token:
            raise ValueError(f"the web token file {os.fspath(path)} is empty")
        return token
    return os.environ.get("KBROKER_WEB_TOKEN", "").strip() or None


HOT_ENDPOINTS = 20_000  # endpoints (and each per-endpoint map) a process keeps in memory


def hot_endpoints() -> int:
    """How many endpoints a process's endpoint cache keeps in memory before it moves the least
    recently used to its private database (kafka/dialogs/spill.py): KBROKER_HOT_ENDPOINTS, else
    20,000 (about 60 MB). A positive integer; anything else is refused with its name."""
    raw = os.environ.get("KBROKER_HOT_ENDPOINTS", "").strip()
    if not raw:
        return HOT_ENDPOINTS
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"KBROKER_HOT_ENDPOINTS must be a positive integer, not {raw!r}")
    return n
