"""SEND sequence numbers persisted in reserved blocks, the pure rule: an endpoint record is due
only when a SEND runs out of its reserved block. The records on the real broker are checked in
tests/integration/test_sequences.py."""

from __future__ import annotations

from kbroker.core.conversation_endpoint import (
    CONVERSING,
    SEQUENCE_BLOCK,
    STARTED_OUTBOUND,
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
