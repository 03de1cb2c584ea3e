"""The commit holder in offsets' metadata (core/txn/commit_holder.py): written by the committer, read
by a partition's next owner, and possibly written by any other client."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.receive.offsets import METADATA_LIMIT, PartitionOffsets, decode_completed, encode_completed
from kbroker.core.txn.commit_holder import (
    MAX_IDS,
    ROOM,
    holder_ids,
    holder_of,
    split_holder,
    transactional_id,
    with_holder,
)


def test_a_committers_ids_come_back_from_its_offsets_metadata():
    ids = tuple(transactional_id("ns1", uuid.uuid4()) for _ in range(2))
    metadata = with_holder(encode_completed(10, [12, 15]), holder_of(ids, "ns1"))
    assert holder_ids(metadata, "ns1") == ids
    assert decode_completed(10, metadata) == {12, 15}  # the completed offsets read as before
    assert PartitionOffsets(10, metadata).already_done(12)


def test_metadata_without_a_holder_names_nobody_and_keeps_its_offsets():
    metadata = encode_completed(0, [3])
    assert holder_ids(metadata, "ns1") == () and holder_ids(None, "ns1") == () and holder_ids("", "ns1") == ()
    assert decode_completed(0, metadata) == {3}
    assert with_holder(metadata, "") == metadata


def test_ids_outside_the_namespace_are_never_named():
    """A holder names UUIDs only: the ids are rebuilt under the reader's namespace, so forged
    metadata cannot steer a fence to another namespace's or another application's ids."""
    assert holder_of(("kbroker.other.%s" % uuid.uuid4(), "app-txn-1"), "ns1") == ""
    forged = f"|by:{uuid.uuid4().hex},kbroker.victim.txn,../x,{'f' * 40}"
    named = holder_ids(forged, "ns1")
    assert len(named) == 1 and named[0].startswith("kbroker.ns1.")


def test_a_holder_names_at_most_max_ids_and_fits_its_room():
    ids = tuple(transactional_id("n", uuid.uuid4()) for _ in range(MAX_IDS + 3))
    holder = holder_of(ids, "n")
    assert len(holder_ids(with_holder("", holder), "n")) == MAX_IDS
    assert len(with_holder("", holder)) <= ROOM
    many = "|by:" + ",".join(uuid.uuid4().hex for _ in range(100))
    assert len(holder_ids(many, "n")) == MAX_IDS


@given(st.text(max_size=300))
def test_any_metadata_parses_to_a_bounded_answer_without_raising(metadata):
    ids = holder_ids(metadata, "ns1")
    assert len(ids) <= MAX_IDS and all(t.startswith("kbroker.ns1.") for t in ids)
    body, holder = split_holder(metadata)
    assert body + ("|by:" + holder if "|by:" in metadata else "") == metadata
    decode_completed(0, metadata)


def test_a_full_partitions_metadata_with_the_holder_stays_under_kafkas_limit():
    """metadata_room() keeps the room the holder takes: at its last True, the encoding plus the
    largest holder fits in offset.metadata.max.bytes."""
    import random

    rnd = random.Random(7)
    p = PartitionOffsets(0)
    offset = 0
    p.fetched(offset)  # the low water stays at 0: every later completion is "above"
    while p.metadata_room():
        offset += rnd.randint(1, 3_000_000)
        p.fetched(offset)
        p.complete(offset)
    p.reopen(offset)  # the last one went over; back to where room was still said
    pos, metadata = p.commit_position()
    holder = ",".join(uuid.uuid4().hex for _ in range(MAX_IDS))
    assert len(with_holder(metadata, holder).encode()) <= METADATA_LIMIT
