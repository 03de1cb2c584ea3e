"""Queue names as Service Broker allows them, and the keys that name their topics (pure; the
layout and the catalog's kept keys are names.py's). A key is injective and holds only what
Kafka allows, with no '.' and no '_' but its leading ones, so no two keys ever meet in Kafka's
comparison of topic names ('.' and '_' are one character there)."""

from __future__ import annotations

import functools
import hashlib
import re

MAX_QUEUE_NAME = 128  # a sysname
_PLAIN_KEY = re.compile(r"[A-Za-z0-9-]{1,100}")
MAX_KEY = 120  # with the longest prefix (55) and secondary suffix (65), within Kafka's 249


def queue_name_problem(queue: object) -> str | None:
    """Why `queue` is no queue name Service Broker allows (1-128 characters, no control
    character), or None."""
    if not isinstance(queue, str) or not 1 <= len(queue) <= MAX_QUEUE_NAME:
        return f"must be 1-{MAX_QUEUE_NAME} characters"
    bad = next((c for c in queue if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF), None)
    return None if bad is None else f"holds the character U+{ord(bad):04X}, which no name may"


@functools.lru_cache(maxsize=4096)
def encoded_key(queue: str) -> str:
    """The key of a queue named now (see the module's docstring): injective, at most MAX_KEY
    characters, of A-Z a-z 0-9 '-' after at most two leading '_'."""
    if _PLAIN_KEY.fullmatch(queue):
        return queue
    escaped = "".join(c if c.isascii() and c.isalnum() else f"-{ord(c):x}-" for c in queue)
    if 1 + len(escaped) <= MAX_KEY:
        return "_" + escaped
    return "__" + escaped[:80] + "-" + hashlib.sha256(queue.encode()).hexdigest()[:32]


def decoded_key(key: str) -> str | None:
    """The queue name an encoded key stands for, when the key says it (a hashed one does not).
    A topic name is anyone's to choose: a key for a name no queue may have (a control character,
    a lone surrogate that no encoder takes) says none."""
    if _PLAIN_KEY.fullmatch(key):
        return key
    if key.startswith("__") or not key.startswith("_"):
        return None
    out, rest = [], key[1:]
    while rest:
        if rest[0] != "-":
            out.append(rest[0])
            rest = rest[1:]
            continue
        code, dash, rest = rest[1:].partition("-")
        if not dash or not code or not all(c in "0123456789abcdef" for c in code) or int(code, 16) > 0x10FFFF:
            return None
        out.append(chr(int(code, 16)))
    name = "".join(out)
    return name if queue_name_problem(name) is None and encoded_key(name) == key else None
