"""The ids of messages and conversations (core/ids.py): version-4 UUIDs, written as uuid writes them."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core import ids


@given(st.integers(0, 2**128 - 1))
def test_an_id_is_written_as_uuid_writes_it(bits):
    class Fixed:
        def getrandbits(self, n: int) -> int:
            assert n == 128
            return bits

    real, ids._rng = ids._rng, Fixed()
    try:
        got = ids.new_id()
    finally:
        ids._rng = real
    as_uuid = uuid.UUID(got)
    assert got == str(as_uuid) and as_uuid.version == 4 and as_uuid.variant == uuid.RFC_4122
    assert as_uuid.int == (bits & ids._VERSION_MASK) | ids._VERSION_BITS


def test_ids_differ():
    assert len({ids.new_id() for _ in range(10_000)}) == 10_000


@given(st.uuids(), st.text(max_size=80))
def test_a_name_id_is_uuid5s(namespace, name):
    assert ids.name_id(namespace, name) == str(uuid.uuid5(namespace, name))
