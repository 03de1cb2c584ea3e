"""RECEIVE's checks of a record it reads, as SEND's of one it writes (kbroker.core.dialogs.sequence_reach
and Statements.refused_record / closed_records), with no broker: the sequence rule, a body over
the queue's limit, and a message for a CLOSED endpoint."""

from __future__ import annotations

from dataclasses import replace

import orjson
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    DISCONNECTED_OUTBOUND,
    handle_for,
    new_target_endpoint,
)
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE, Envelope, Message
from kbroker.core.dialogs.send_lease import SEQUENCE_SPAN, first_claim
from kbroker.core.dialogs.sequence_reach import MAX_SEQUENCE, reach, sequence_refusal
from kbroker.core.dialogs.statements import DEAD_LETTERED, Statements
from tests.unit.test_statements import (
    CLAIM,
    CONTRACT,
    EMPLOYEES,
    EXPENSES,
    NOW,
    NS,
    Consumed,
    World,
    world,  # noqa: F401 - the fixture
)


def message(conversation: str, seq: int, kind: str = CLAIM, body: bytes = b"{}", **env_kw) -> Message:
    env = Envelope("m", conversation, "g", seq, kind, CONTRACT, EMPLOYEES, EXPENSES, "TARGET", **env_kw)
    return Message(
        queue="ExpenseQueue",
        conversation_handle=handle_for(conversation, "TARGET"),
        conversation_id=conversation,
        conversation_group_id="g",
        message_sequence_number=seq,
        message_type_name=kind,
        service_name=EXPENSES,
        service_contract_name=CONTRACT,
        message_id="m",
        body=body,
        extra={"envelope": env, "record": Consumed()},
    )


# --- the sequence rule ---------------------------------------------------------------------------

CLAIMS = st.lists(st.tuples(st.integers(0, 3000), st.booleans()), min_size=1, max_size=8)


def sender_history(claims: list[tuple[int, bool]]) -> tuple[int | None, list[int]]:
    """Play a side's sends as kbroker's leases allow them: for each (sends, released), claim the
    lease where the last record says (its ceiling, or a released lease's exact next), send
    `sends` numbers (renewing before the ceiling), then release or crash (the next claim starts
    at the ceiling: a gap of up to 1,024). Returns (the latest lease's reach, every number sent)."""
    lease = None
    sent: list[int] = []
    nxt = 0
    for sends, released in claims:
        start = max(nxt, lease.ceiling if lease is not None else 0)
        lease = first_claim("h", "p", 0.0, (), start) if lease is None else lease.claimed("p", 0.0, (), start)
        nxt = start
        for _ in range(sends):
            if nxt >= lease.ceiling:  # the holder renews before it goes past the ceiling
                lease = lease.renewed(0.0, nxt, ())
            sent.append(nxt)
            nxt += 1
        if released:
            lease = lease.released(0.0, nxt, None)
    return reach(lease, None), sent


@given(CLAIMS)
def test_every_number_a_sender_can_send_is_accepted_gaps_and_all(claims) -> None:
    """However a side's processes claim, crash (a gap up to 1,024 per claim), renew and release,
    every number it sent is below the reach of its latest lease record: never refused."""
    bound, sent = sender_history(claims)
    assert bound is not None
    assert all(sequence_refusal(n, CLAIM, False, bound) is None for n in sent)


@given(CLAIMS, st.integers(0, MAX_SEQUENCE))
def test_a_number_past_the_senders_reach_is_refused(claims, past) -> None:
    """A number at or past the reach (no holder was ever allowed it) is refused, and so is any
    number outside Service Broker's bigint; -1 only on kbroker's own messages."""
    bound, _ = sender_history(claims)
    assert bound is not None
    seq = min(bound + past, MAX_SEQUENCE)
    if seq >= bound:
        assert "past any its sender can have sent" in (sequence_refusal(seq, CLAIM, False, bound) or "")
    assert sequence_refusal(MAX_SEQUENCE + 1, CLAIM, False, None) is not None
    assert sequence_refusal(-2, CLAIM, False, None) is not None
    assert sequence_refusal(SYSTEM_SEQUENCE, DIALOG_TIMER, True, bound) is None
    assert sequence_refusal(SYSTEM_SEQUENCE, CLAIM, False, bound) is not None


def test_reach_takes_the_endpoints_reservation_and_needs_no_record_below_the_first_lease() -> None:
    """A transaction may send past its lease's ceiling under one claim; the endpoint record it
    commits with reserves past its last number. With no record at all, nothing is known."""
    ep = new_target_endpoint("c", "g", "fg", EXPENSES, EMPLOYEES, CONTRACT)
    assert reach(None, None) is None
    assert reach(None, ep) == SEQUENCE_SPAN  # every side's first lease covers 0..1023
    assert reach(first_claim("h", "p", 0.0, ()), replace(ep, send_sequence=5000, sequence_reserved=5064)) == 5064


# --- through Statements: what RECEIVE refuses ---------------------------------------------------


class Reaches:
    """A fake endpoints topic: each side's reach, and which sides were looked up."""

    def __init__(self, known: dict[str, int]):
        self.known, self.asked = known, []

    def __call__(self, handle: str, sequence: int) -> int | None:
        self.asked.append((handle, sequence))
        return self.known.get(handle)


def test_a_huge_sequence_on_a_local_dialog_is_refused_with_its_dead_letter_and_event() -> None:
    world = World()
    initiator = world.dialog()
    reaches = Reaches({initiator.conversation_handle: 1024})
    st_ = Statements(NS, world.lookup, world.in_group, clock=lambda: NOW, sender_reach=reaches)
    target = new_target_endpoint(
        initiator.conversation_id, "g", initiator.conversation_group_id, EXPENSES, EMPLOYEES, CONTRACT
    )
    assert st_.refused_record(message(initiator.conversation_id, 3), target) is None
    assert reaches.asked == []  # below any side's first lease: no look-up
    assert st_.refused_record(message(initiator.conversation_id, 1023), target) is None
    records, reason = st_.refused_record(message(initiator.conversation_id, 10**12), target)
    assert reaches.asked == [(initiator.conversation_handle, 10**12)]
    dead, event = records
    assert dead[0] == names.deadletter_topic(NS) and "sequence number 1000000000000" in reason
    assert dict(dead[3])["kb.dlq.reason"].decode() == reason
    assert event[:2] == (names.events_topic(NS), "ExpenseQueue")
    assert orjson.loads(event[2]) == {
        "event": DEAD_LETTERED,
        "queue": "ExpenseQueue",
        "topic": Consumed().topic(),
        "partition": 2,
        "offset": 41,
        "reason": reason,
        "time": int(NOW * 1000),
    }
    # An EndDialog is the broker's, but it carries the sender's number too.
    assert st_.refused_record(message(initiator.conversation_id, 10**12, END_DIALOG, b""), target) is not None


def test_a_side_in_another_namespace_is_not_looked_up_here() -> None:
    """A routed dialog's far side keeps its lease in its own namespace; its dispatcher saves the
    numbers in order. Only the 63-bit range is checked here."""
    world = World()
    reaches = Reaches({})
    st_ = Statements(NS, world.lookup, world.in_group, clock=lambda: NOW, sender_reach=reaches)
    remote = replace(new_target_endpoint("c", "g", "fg", EXPENSES, EMPLOYEES, CONTRACT, far_broker="other"))
    assert st_.refused_record(message("c", 5000), remote) is None
    assert st_.refused_record(message("c", 5000, from_broker="other"), None) is None
    assert reaches.asked == []
    assert st_.refused_record(message("c", MAX_SEQUENCE + 1), remote) is not None


def test_a_body_over_the_queues_limit_is_refused_as_the_dispatcher_refuses_it(world: World) -> None:
    limit = world.catalog.queues["ExpenseQueue"].max_message_bytes
    body = orjson.dumps({"pad": "x" * limit})
    records, reason = world.statements.refused_record(message("c", 0, body=body))
    assert "error -9602" in reason and f"takes at most {limit}" in reason and str(len(body)) in reason
    assert [r[0] for r in records] == [names.deadletter_topic(NS), names.events_topic(NS)]
    assert world.statements.refused_record(message("c", 0, body=b"{}")) is None


def test_a_message_for_a_closed_endpoint_is_set_aside_not_dropped(world: World) -> None:
    initiator = world.dialog()
    target = new_target_endpoint(
        initiator.conversation_id, "g", initiator.conversation_group_id, EXPENSES, EMPLOYEES, CONTRACT
    )
    closed = replace(target, state=CLOSED)
    msg = message(initiator.conversation_id, 4)
    assert world.statements.closed_records(msg, target) is None
    assert world.statements.closed_records(msg, replace(target, state=DISCONNECTED_OUTBOUND)) is None  # crossed the end
    records, reason = world.statements.closed_records(msg, closed)
    assert [r[0] for r in records] == [names.deadletter_topic(NS), names.events_topic(NS)]
    assert "CLOSED" in reason and target.conversation_handle in reason
    # The peer's EndDialog after a WITH CLEANUP, or a timer, is only consumed.
    assert world.statements.closed_records(message(initiator.conversation_id, 5, END_DIALOG, b""), closed) is None
    assert world.statements.closed_records(message(initiator.conversation_id, -1, DIALOG_TIMER, b""), closed) is None
    # Ended here WITH CLEANUP: its messages are discarded, as Service Broker deletes them.
    assert world.statements.closed_records(msg, replace(closed, cleaned_up=True)) is None


def test_the_checks_use_the_catalog_a_receive_found_and_look_up_only_what_it_lacks(world: World) -> None:
    """RECEIVE reads the catalog once and checks every message it took against that copy: no
    look-up per message. An object the copy lacks (a message type defined since) is looked up
    once more rather than refused on arrival."""
    looked_up: list[str] = []

    def lookup(fn):
        looked_up.append("read")
        return fn(world.catalog)

    st_ = Statements(NS, lookup, world.in_group, clock=lambda: NOW)
    copy = world.catalog
    assert all(st_.refused_record(message("c", 0), None, copy) is None for _ in range(5))
    assert looked_up == []
    without_claim = copy.model_copy(
        update={"message_types": {k: v for k, v in copy.message_types.items() if k != CLAIM}}
    )
    assert st_.refused_record(message("c", 0), None, without_claim) is None  # found on the look-up
    assert looked_up == ["read"]
