"""Random UUIDs for message and conversation ids without a system call per id.

uuid.uuid4() reads os.urandom, which releases the GIL; with dozens of reader threads each id
then waits for the GIL to come back, and the profile of a request/reply run showed more time
there than anywhere else outside the Kafka commit. A per-process Mersenne Twister seeded from
os.urandom (reseeded in a forked child) gives the same 122 random bits without that round trip.
These ids need uniqueness, not secrecy.
"""

from __future__ import annotations

import hashlib
import os
import random
import uuid

_VERSION_MASK = ~(0xF000 << 64) & ~(0xC000 << 48)
_VERSION_BITS = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant
_NAME_BITS = (0x5000 << 64) | (0x8000 << 48)  # version 5 (a name's SHA-1), the same variant
_rng = random.Random()


def _reseed() -> None:
    _rng.seed(int.from_bytes(os.urandom(32), "big"))


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A version-4 UUID string, as str(uuid.UUID(int=...)) writes it, without building the UUID
    (its checks were a quarter of an id's cost, and every SEND makes one)."""
    return _written((_rng.getrandbits(128) & _VERSION_MASK) | _VERSION_BITS)


def name_id(namespace: uuid.UUID, name: str) -> str:
    """str(uuid.uuid5(namespace, name)) without building the UUIDs: every RECEIVE names each
    message's endpoint handle this way (conversation_endpoint.handle_for)."""
    digest = hashlib.sha1(namespace.bytes + name.encode()).digest()
    return _written((int.from_bytes(digest[:16], "big") & _VERSION_MASK) | _NAME_BITS)


def _written(bits: int) -> str:
    h = "%032x" % bits
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
