"""The statements' conversation group lock, the pure parts (core/dialogs/group_lock.py): which lock a
statement takes, its error, the group buffer's lock without a record, and the overlap counter
of the invariant run (tests/helpers/invariants.hold_overlaps)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from kbroker import errors
from kbroker.core.dialogs.conversation_endpoint import new_target_endpoint
from kbroker.core.dialogs.group_lock import ConversationGroupLockTimeoutError, group_key
from kbroker.core.receive.group_buffer import GroupBuffer
from tests.helpers.invariants import hold_overlaps
from tests.unit.test_group_buffer import FakeLease, rec


def test_the_error_is_a_retriable_conversation_lock_timeout_with_sql_servers_deadlock_number():
    err = ConversationGroupLockTimeoutError("g1", 2.0)
    assert isinstance(err, errors.ConversationLockTimeoutError) and err.retriable
    assert err.number == 1205 and err.group == "g1" and "conversation group g1" in str(err)
    assert ConversationGroupLockTimeoutError("g1", 2.0, "h1").handle == "h1"  # the statement's conversation


def test_a_locked_group_is_received_only_by_its_owner_and_ready_again_on_release():
    buf: GroupBuffer[FakeLease] = GroupBuffer()
    buf.accept(rec("g"))
    sender, reader = object(), object()
    lease = FakeLease(sender)
    buf.lock(lease, "g", 0)
    assert buf.holder("g") is lease
    assert buf.pick(reader, {}) is None  # the group lock keeps RECEIVE off it
    assert buf.pick(reader, {}, group="g") is None
    assert buf.pick(sender, {}) == "g"  # its holder's own RECEIVE takes it
    buf.release(lease, "g")
    assert buf.holder("g") is None and buf.pick(reader, {}) == "g"


def test_which_group_a_statement_locks():
    g, far = str(uuid.uuid4()), str(uuid.uuid4())
    ep = new_target_endpoint("c1", g, far, "//b", "//a", "C")
    assert group_key(ep, "Q").group == g and group_key(ep, "Q").receiver == ("Q", None)
    assert group_key(ep, "Q", "other").group == "other"  # MOVE's destination
    assert group_key(ep, "Q").fallback != group_key(ep, "Q", "other").fallback
    assert group_key(replace(ep, instance="i1"), "Q").receiver == ("Q", "i1")  # its secondary queue


def test_hold_overlaps_counts_each_overlapping_pair_of_a_group():
    holds = [
        {"group": "g", "start": 0.0, "end": 2.0, "who": "a"},
        {"group": "g", "start": 1.0, "end": 1.5, "who": "b"},
        {"group": "g", "start": 1.8, "end": 3.0, "who": "c"},
        {"group": "g", "start": 3.0, "end": 4.0, "who": "d"},  # starts as c ends: no overlap
        {"group": "h", "start": 0.5, "end": 5.0, "who": "e"},
    ]
    assert hold_overlaps(holds) == ["g: a and b", "g: a and c"]
