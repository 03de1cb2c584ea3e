"""SEND sequence numbers persisted in reserved blocks, the pure rule: an endpoint record is due
only when a SEND runs out of its reserved block. The records on the real broker are checked in
tests/integration/test_sequences.py."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.conversation_endpoint import (
    CONVERSING,
    SEQUENCE_BLOCK,
    STARTED_OUTBOUND,
    STATE_DESC,
    Endpoint,
    after_send,
    handle_for,
    must_persist,
)


def test_a_send_persists_the_endpoint_only_when_its_reserved_block_runs_out():
    ep = Endpoint(handle_for("c", "INITIATOR"), "c", "INITIATOR", "c", "c", "S", "T", "K", STARTED_OUTBOUND)
    written = []
    for _ in range(2 * SEQUENCE_BLOCK + 3):
        nxt = after_send(ep)
        if must_persist(ep, nxt):
            written.append(ep.send_sequence)
        assert nxt.send_sequence == ep.send_sequence + 1 and nxt.sequence_reserved > ep.send_sequence
        ep = nxt
    assert ep.state == CONVERSING
    assert written == [0, SEQUENCE_BLOCK + 1, 2 * SEQUENCE_BLOCK + 2]


_texts = st.text(min_size=1, max_size=8)
_endpoints = st.builds(
    Endpoint,
    conversation_handle=_texts,
    conversation_id=_texts,
    side=st.sampled_from(["INITIATOR", "TARGET"]),
    conversation_group_id=_texts,
    far_conversation_group_id=_texts,
    service_name=_texts,
    far_service_name=_texts,
    service_contract_name=_texts,
    state=st.sampled_from(sorted(STATE_DESC)),
    send_sequence=st.integers(0, 10_000),
    sequence_reserved=st.integers(0, 10_000),
    lifetime=st.none() | st.integers(0, 2**31),
    group_chain=st.lists(_texts, max_size=3).map(tuple),
    instance=st.none() | _texts,
    remote=st.booleans(),
    cleaned_up=st.booleans(),
)


@given(_endpoints)
def test_a_send_changes_the_endpoint_as_dataclasses_replace_would(ep):
    """after_send copies the endpoint's fields instead of running replace() (the per-message
    cost): the result is the same object replace() builds, of the same class, still frozen."""
    state = CONVERSING if ep.state == STARTED_OUTBOUND else ep.state
    expected = replace(ep, send_sequence=ep.send_sequence + 1, state=state)
    if state != ep.state or ep.send_sequence >= ep.sequence_reserved:
        expected = replace(expected, sequence_reserved=expected.send_sequence + SEQUENCE_BLOCK)
    got = after_send(ep)
    assert type(got) is Endpoint and got == expected and got.to_json() == expected.to_json()
    assert vars(got) == vars(expected) and vars(ep) == vars(replace(ep))  # the original is untouched
    with pytest.raises(FrozenInstanceError):
        got.state = "x"  # type: ignore[misc]


def test_an_endpoint_has_nothing_a_field_copy_would_miss():
    """What after_send's copy relies on: no __post_init__, no slots, only the fields in __dict__."""
    ep = Endpoint(handle_for("c", "INITIATOR"), "c", "INITIATOR", "c", "c", "S", "T", "K", STARTED_OUTBOUND)
    assert not hasattr(Endpoint, "__post_init__") and not hasattr(Endpoint, "__slots__")
    assert set(vars(ep)) == {f.name for f in fields(Endpoint)}
