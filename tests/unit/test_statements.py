"""Statement building (kbroker.core.dialogs.statements) against the sample catalog, with no broker: the
records a statement produces, and the endpoint after it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from kbroker.core import names
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import END_DIALOG, Catalog
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dialogs import timers
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    CONVERSING,
    DISCONNECTED_INBOUND,
    DISCONNECTED_OUTBOUND,
    Endpoint,
    chain_key,
    default_group,
    handle_for,
    merged_state,
    new_target_endpoint,
)
from kbroker.core.dialogs.envelope import Envelope, Message
from kbroker.core.dialogs.groups import MOVE_MARKER
from kbroker.core.dialogs.statements import Statements, dead_letter_record
from kbroker.errors import (
    CatalogError,
    ContractViolationError,
    ConversationClosedError,
    ConversationGroupError,
    InvalidArgumentError,
    UnknownServiceError,
)

SAMPLES = Path(__file__).resolve().parents[2] / "topics" / "samples"
NS = "unit"
EMPLOYEES = "//Adventure-Works.com/Employees"
EXPENSES = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"
NOW = 1_700_000_000.0

T = TypeVar("T")


class World:
    """A Statements over the sample catalog with an in-memory endpoint list."""

    def __init__(self) -> None:
        self.catalog = load_definitions([SAMPLES], NS)
        self.endpoints: dict[str, Endpoint] = {}
        self.statements = Statements(NS, self.lookup, self.in_group, clock=lambda: NOW)

    def lookup(self, fn: Callable[[Catalog], T]) -> T:
        return fn(self.catalog)

    def in_group(self, group: str) -> list[Endpoint]:
        return [ep for ep in self.endpoints.values() if ep.conversation_group_id == group]

    def endpoint_of(self, handle: str) -> Endpoint:
        return self.endpoints[handle]

    def dialog(self, **kw: Any) -> Endpoint:
        ep = self.statements.new_dialog(EMPLOYEES, EXPENSES, CONTRACT, endpoint_of=self.endpoint_of, **kw)
        self.endpoints[ep.conversation_handle] = ep
        return ep


def headers(record: tuple) -> dict[str, str]:
    return {k: v.decode() for k, v in record[3]}


@pytest.fixture
def world() -> World:
    return World()


def test_send_is_keyed_by_the_far_group_with_the_next_sequence(world: World) -> None:
    ep = world.dialog()
    record, message_id, after = world.statements.message_record(ep, CLAIM, {"amount": 12})
    topic, key, value, _ = record
    assert topic == names.queue_topic(NS, "ExpenseQueue")  # the far side's queue
    assert key == ep.far_conversation_group_id
    assert orjson.loads(value) == {"amount": 12}
    h = headers(record)
    assert h["kb.message_id"] == message_id
    assert h["kb.message_type_name"] == CLAIM
    assert h["kb.message_sequence_number"] == "0"
    assert h["kb.to_side"] == "TARGET"
    assert h["kb.from_service_name"] == EMPLOYEES
    assert (after.send_sequence, after.state) == (1, CONVERSING)
    record2, _, _ = world.statements.message_record(after, CLAIM, {"amount": 13})
    assert headers(record2)["kb.message_sequence_number"] == "1"


def test_each_side_has_its_own_default_group(world: World) -> None:
    """Derived from the dialog id and the side: the first SEND is keyed to the target's group
    without a lookup, and tells the target the initiator's group. Before, both sides' group was
    the dialog id, so a dialog between two services of one queue held one group."""
    ep = world.dialog()
    cid = ep.conversation_id
    assert ep.conversation_group_id == default_group(cid, "INITIATOR")
    assert ep.far_conversation_group_id == default_group(cid, "TARGET")
    assert len({cid, ep.conversation_group_id, ep.far_conversation_group_id}) == 3
    record, message_id, _ = world.statements.message_record(ep, CLAIM, {"amount": 1})
    env = Envelope.from_headers(record[3])
    assert record[1] == env.conversation_group_id == default_group(cid, "TARGET")
    msg = Message(
        queue="ExpenseQueue",
        conversation_handle=handle_for(cid, "TARGET"),
        conversation_id=cid,
        conversation_group_id=env.conversation_group_id,
        message_sequence_number=0,
        message_type_name=CLAIM,
        service_name=EXPENSES,
        service_contract_name=CONTRACT,
        message_id=message_id,
        body=record[2],
        extra={"envelope": env},
    )
    keep, target = world.statements.after_receive(msg, None)
    assert keep and target is not None
    assert (target.conversation_group_id, target.far_conversation_group_id) == (
        default_group(cid, "TARGET"),
        default_group(cid, "INITIATOR"),
    )


def test_send_outside_the_contract_is_a_contract_violation(world: World) -> None:
    ep = world.dialog()
    with pytest.raises(ContractViolationError, match="INITIATOR"):
        world.statements.message_record(ep, APPROVAL, {})  # the TARGET's message type
    with pytest.raises(ContractViolationError):
        world.statements.message_record(ep, END_DIALOG)  # system types are END CONVERSATION's


def test_send_on_an_expired_dialog_is_refused(world: World) -> None:
    ep = world.dialog(lifetime=60)
    assert ep.lifetime == int(NOW) + 60
    expired = Statements(NS, world.lookup, world.in_group, clock=lambda: NOW + 61)
    with pytest.raises(ConversationClosedError, match="lifetime expired"):
        expired.message_record(ep, CLAIM, {})


def test_end_after_the_peer_ended_acknowledges_and_closes(world: World) -> None:
    ep = world.statements.message_record(world.dialog(), CLAIM, {})[2].after_peer_end()
    assert ep.state == DISCONNECTED_INBOUND
    records, ended = world.statements.end_records(ep, error=50001, description="ignored", cleanup=False)
    assert [headers(r)["kb.message_type_name"] for r in records] == [END_DIALOG]  # no Error after the peer ended
    assert ended is not None and ended.state == CLOSED


def test_end_with_error_sends_an_error_and_waits_for_the_peer(world: World) -> None:
    ep = world.statements.message_record(world.dialog(), CLAIM, {})[2]
    records, ended = world.statements.end_records(ep, error=50001, description="no", cleanup=False)
    assert [headers(r)["kb.message_type_name"] for r in records] == [ERROR_TYPE]
    assert ended is not None and ended.state == DISCONNECTED_OUTBOUND
    with pytest.raises(ConversationClosedError):
        world.statements.end_records(ended, error=None, description=None, cleanup=False)


def test_end_before_sending_anything_closes_without_records(world: World) -> None:
    records, ended = world.statements.end_records(world.dialog(), error=None, description=None, cleanup=False)
    assert records == [] and ended is not None and ended.state == CLOSED
    records, cleaned = world.statements.end_records(world.dialog(), error=None, description=None, cleanup=True)
    assert records == [] and cleaned is not None and cleaned.state == CLOSED  # kept: its messages are discarded


def test_timer_record_is_keyed_by_handle_and_arm_and_rearming_tombstones(world: World) -> None:
    ep = world.dialog()
    records, armed = world.statements.timer_records(ep, 30)
    assert len(records) == 1
    topic, key, value, _ = records[0]
    assert topic == names.timers_topic(NS)
    assert key == timers.timer_key(ep.conversation_handle, armed.dialog_timer_id or "")
    assert armed.dialog_timer == NOW + 30
    assert orjson.loads(value)["topic"] == names.queue_topic(NS, "EmployeeQueue")  # this side's own queue
    again, rearmed = world.statements.timer_records(armed, 5)
    assert (again[0][1], again[0][2]) == (key, None)  # the old arm's tombstone first
    assert again[1][1] == timers.timer_key(ep.conversation_handle, rearmed.dialog_timer_id or "")


def test_lifetime_adds_the_lifetime_timer(world: World) -> None:
    assert world.statements.lifetime_records(world.dialog()) == []
    ep = world.dialog(lifetime=60)
    [(topic, key, _, _)] = world.statements.lifetime_records(ep)
    assert (topic, key) == (names.timers_topic(NS), timers.lifetime_key(ep.conversation_id))


@pytest.mark.parametrize(
    "call",
    [
        lambda w: w.dialog(lifetime=0),
        lambda w: w.dialog(
            related_conversation=w.dialog().conversation_handle, related_conversation_group=str(uuid.uuid4())
        ),
        lambda w: w.dialog(related_conversation_group="group-1"),
        lambda w: w.statements.message_record(w.dialog(), CLAIM, {}, priority=11),
        lambda w: w.statements.end_records(
            w.statements.message_record(w.dialog(), CLAIM, {})[2], error=-5, description=None, cleanup=False
        ),
        lambda w: w.statements.timer_records(w.dialog(), 0),
        lambda w: w.statements.timer_records(w.dialog(), True),
        lambda w: w.statements.move_records(w.dialog(), "not a guid"),
    ],
    ids=[
        "lifetime",
        "both related clauses",
        "group not a guid",
        "priority",
        "error code",
        "timeout",
        "timeout bool",
        "move not a guid",
    ],
)
def test_bad_arguments_are_invalid_argument_errors(world: World, call: Callable[[World], Any]) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        call(world)
    assert isinstance(caught.value, ValueError)  # still a ValueError, as before


def test_unknown_service_is_a_catalog_error(world: World) -> None:
    with pytest.raises(UnknownServiceError):
        world.statements.new_dialog("//nowhere", EXPENSES, CONTRACT, endpoint_of=world.endpoint_of)


def test_lookup_is_the_callers_so_a_refreshed_catalog_is_seen() -> None:
    """Statements asks its lookup each time: a lookup that re-reads the catalog on CatalogError
    (as Broker's does) finds an object defined after the first read."""
    full = load_definitions([SAMPLES], NS)
    reads = [full.model_copy(update={"services": {}}), full]

    def lookup(fn: Callable[[Catalog], T]) -> T:
        try:
            return fn(reads[0])
        except CatalogError:
            reads.pop(0)
            return fn(reads[0])

    ep = Statements(NS, lookup, lambda group: []).new_dialog(EMPLOYEES, EXPENSES, CONTRACT, endpoint_of=lambda h: None)
    assert ep.service_name == EMPLOYEES and len(reads) == 1


def test_related_group_of_another_queue_is_refused(world: World) -> None:
    employee_side = world.dialog()  # its group belongs to EmployeeQueue
    target = new_target_endpoint(
        employee_side.conversation_id + "x", str(uuid.uuid4()), "g", EXPENSES, EMPLOYEES, CONTRACT
    )
    world.endpoints[target.conversation_handle] = target  # a group used on ExpenseQueue only
    with pytest.raises(ConversationGroupError, match="ExpenseQueue"):
        world.dialog(related_conversation_group=target.conversation_group_id)
    same = world.dialog(related_conversation_group=employee_side.conversation_group_id)
    assert same.conversation_group_id == employee_side.conversation_group_id
    related = world.dialog(related_conversation=employee_side.conversation_handle)
    assert related.conversation_group_id == employee_side.conversation_group_id


def test_move_after_sending_writes_a_marker_to_the_old_group(world: World) -> None:
    ep = world.statements.message_record(world.dialog(), CLAIM, {})[2]
    group = str(uuid.uuid4())
    moved, records = world.statements.move_records(ep, group.upper())
    assert moved.conversation_group_id == group  # canonical form
    marker, chain = records
    assert marker[0] == names.queue_topic(NS, "EmployeeQueue") and marker[1] == ep.conversation_group_id
    assert headers(marker)["kb.message_type_name"] == MOVE_MARKER
    assert chain[:2] == (names.endpoints_topic(NS), chain_key(ep.conversation_handle))
    assert orjson.loads(chain[2]) == [ep.conversation_group_id, group]
    assert world.statements.move_records(world.dialog(), group)[1] == []  # nothing sent yet: no marker


def received(ep: Endpoint, message_type: str, to_side: str = "TARGET") -> Message:
    env = Envelope(
        message_id="m",
        conversation_id=ep.conversation_id,
        conversation_group_id="g",
        message_sequence_number=0,
        message_type_name=message_type,
        service_contract_name=CONTRACT,
        from_service_name=EMPLOYEES,
        to_service_name=EXPENSES,
        to_side=to_side,
    )
    return Message(
        queue="ExpenseQueue",
        conversation_handle="h",
        conversation_id=ep.conversation_id,
        conversation_group_id="g",
        message_sequence_number=0,
        message_type_name=message_type,
        service_name=EXPENSES,
        service_contract_name=CONTRACT,
        message_id="m",
        body=b"{}",
        extra={"envelope": env},
    )


def test_first_message_creates_the_target_endpoint(world: World) -> None:
    initiator = world.dialog()
    keep, created = world.statements.after_receive(received(initiator, CLAIM), None)
    assert keep and created is not None
    assert (created.side, created.state, created.service_name) == ("TARGET", CONVERSING, EXPENSES)
    assert created.far_conversation_group_id == initiator.conversation_id


def test_peer_end_after_local_end_closes_silently(world: World) -> None:
    ep = world.statements.message_record(world.dialog(), CLAIM, {})[2].after_local_end()
    assert ep.state == DISCONNECTED_OUTBOUND
    keep, after = world.statements.after_receive(received(ep, END_DIALOG, "INITIATOR"), ep)
    assert not keep and after is not None and after.state == CLOSED
    keep, after = world.statements.after_receive(received(ep, APPROVAL, "INITIATOR"), ep)
    assert (keep, after) == (False, None)  # anything else after ending is discarded


class Consumed:
    """A consumed record with the methods of confluent_kafka.Message that dead-lettering reads."""

    def topic(self) -> str:
        return "kb.unit.q.ExpenseQueue"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 41

    def key(self) -> bytes:
        return b"not-the-group"

    def value(self) -> bytes:
        return b"body"

    def headers(self) -> list[tuple[str, bytes]]:
        return [("kb.message_id", b"m1")]


def test_dead_letter_keeps_the_record_and_says_why_and_where_from() -> None:
    topic, key, value, hdrs = dead_letter_record(NS, Consumed(), "record key does not match")
    assert (topic, key, value) == (names.deadletter_topic(NS), b"not-the-group", b"body")
    assert hdrs == [
        ("kb.message_id", b"m1"),
        ("kb.dlq.reason", b"record key does not match"),
        ("kb.dlq.topic", b"kb.unit.q.ExpenseQueue"),
        ("kb.dlq.partition", b"2"),
        ("kb.dlq.offset", b"41"),
    ]


def test_a_dialog_without_lifetime_never_expires(world: World) -> None:
    """No LIFETIME: the endpoint has none (None), so no clock date, 2038's included, ever
    refuses a SEND; an endpoint written with the old 2**31-1 sentinel reads as none."""
    ep = world.dialog()
    assert ep.lifetime is None and world.statements.lifetime_records(ep) == []
    far_future = Statements(NS, world.lookup, world.in_group, clock=lambda: 2.0**31 + 10**9)  # past 2038
    far_future.message_record(ep, CLAIM, {})
    legacy = orjson.loads(ep.to_json())
    legacy["lifetime"] = 2**31 - 1
    assert Endpoint.from_json(orjson.dumps(legacy)).lifetime is None


# --- several processes on one side -------------------------------------------------------------


def test_a_stale_endpoint_record_never_moves_the_state_back(world: World) -> None:
    """A process that still holds a CO copy writes it after another process's DI: refused. Two
    ends written from one copy (DO here, DI there) close the endpoint. Before, the last record
    won: the endpoint went back to CO and could SEND after the peer's EndDialog."""
    ep = replace(world.dialog(), state=CONVERSING)
    di, do = ep.after_peer_end(), ep.after_local_end()
    assert merged_state(di, ep) is None and merged_state(replace(ep, state=CLOSED), di) is None
    assert merged_state(ep, di) == di and merged_state(None, ep) == ep
    assert merged_state(di, do).state == CLOSED and merged_state(do, di).state == CLOSED
    assert merged_state(do, replace(do, state=CLOSED)).state == CLOSED


def test_a_message_sent_after_its_side_ended_is_refused_with_an_error_back(world: World) -> None:
    """The peer's EndDialog is here (DI) and then a message of the peer's arrives (one of its
    processes sent from a stale copy): dead-lettered with the reason, and an Error goes back to
    the peer's side. Before, it was delivered after the EndDialog."""
    initiator = world.dialog()
    msg = received(initiator, CLAIM)
    msg.extra["record"] = Consumed()
    target = new_target_endpoint(
        initiator.conversation_id, "g", initiator.conversation_group_id, EXPENSES, EMPLOYEES, CONTRACT
    )
    assert world.statements.late_records(msg, target) is None  # still conversing: delivered
    assert world.statements.late_records(received(initiator, END_DIALOG), target.after_peer_end()) is None
    records, after, reason = world.statements.late_records(msg, target.after_peer_end())
    dead, event, error = records
    assert event[0] == names.events_topic(NS) and orjson.loads(event[2])["reason"] == reason
    assert dead[0] == names.deadletter_topic(NS) and "after the initiator side ended" in reason
    assert error[0] == names.queue_topic(NS, "EmployeeQueue")
    assert headers(error)["kb.message_type_name"] == ERROR_TYPE and b"-9601" in error[2]
    assert after.state == DISCONNECTED_INBOUND and after.send_sequence == target.send_sequence + 1
