"""The pure rules of conversation groups (kbroker.core.dialogs.groups): the chain of groups a moved
conversation leaves behind. The groups against the real broker are in
tests/integration/test_groups.py."""

from __future__ import annotations

import uuid


def test_group_chain_rules():
    """The pure rules of groups.py: hop by hop along the chain, a move back included."""
    from kbroker.core.dialogs.conversation_endpoint import CONVERSING, STARTED_OUTBOUND, Endpoint
    from kbroker.core.dialogs.groups import moved, next_hop

    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    ep = Endpoint("h", "c", "TARGET", "c", "c", "S", "F", "K", CONVERSING)
    assert next_hop(ep, 0) is None
    ep1, marker = moved(ep, a)
    assert marker and ep1.chain == ("c", a) and next_hop(ep1, 0) == a and next_hop(ep1, 1) is None
    ep2, _ = moved(ep1, "c")  # back to where it started: one more hop, never a shortcut
    assert ep2.chain == ("c", a, "c") and next_hop(ep2, 0) == a and next_hop(ep2, 1) == "c"
    assert moved(ep2, "c") == (ep2, False)
    fresh = Endpoint("h", "c", "INITIATOR", "c", "c", "S", "F", "K", STARTED_OUTBOUND)
    assert moved(fresh, b) == (Endpoint("h", "c", "INITIATOR", b, "c", "S", "F", "K", STARTED_OUTBOUND), False)
    assert ep.with_chain(ep2.chain).conversation_group_id == "c" and ep2.with_chain(ep1.chain) == ep2
    assert Endpoint.from_json(ep2.to_json()).chain == ep2.chain
