"""The dispatcher's verdict on a message arriving from another namespace (core/dialogs/arrival.py): SAVE,
WAIT (the sender keeps it and retries: the target service is not here yet, its queue is off) or
REFUSE with Service Broker's error code (the dialog ends with an Error). One test per code path,
their precedence, and a property that checks the verdict against the catalog's own lookups
(Catalog.may_send, service_accepts), a second implementation of the same rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.catalog.models import (
    DEFAULT,
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    Catalog,
    Contract,
    ContractMessage,
    MessageType,
    Queue,
    Service,
)
from kbroker.core.dialogs.arrival import (
    CONTRACT_NOT_FOUND,
    CONTRACT_NOT_SUPPORTED,
    MESSAGE_TYPE_NOT_FOUND,
    NOT_IN_CONTRACT,
    REFUSE,
    SAVE,
    SENT_BY_INITIATOR_ONLY,
    SENT_BY_TARGET_ONLY,
    TOO_LARGE,
    VALIDATION_FAILED,
    WAIT,
    XML_VALIDATION_FAILED,
    Verdict,
    check_arrival,
)
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.dialogs.validation import validate_body
from kbroker.errors import MessageValidationError

REQ, REPLY, ANYJ, PING, ORPHAN, GHOST = (
    "//app/Request",
    "//app/Reply",
    "//app/AnyJson",
    "//app/Ping",
    "//app/Orphan",
    "//app/Ghost",
)
CONTRACT, OTHER, UNKNOWN = "//app/Contract", "//app/Other", "//app/NoSuchContract"
TARGET, INIT, OFF, NOQ, ABSENT = "//svc/Target", "//svc/Initiator", "//svc/Off", "//svc/NoQueue", "//svc/Absent"
LIMIT = 100  # TargetQ's max_message_bytes


def build_catalog() -> Catalog:
    types = [
        MessageType(name=REQ, validation="WELL_FORMED_XML"),
        MessageType(name=REPLY),
        MessageType(name=ANYJ, validation="JSON"),
        MessageType(name=PING, validation="EMPTY"),
        MessageType(name=ORPHAN),
    ]
    contracts = [
        Contract(
            name=CONTRACT,
            messages=[
                ContractMessage(type=REQ, sent_by="INITIATOR"),
                ContractMessage(type=REPLY, sent_by="TARGET"),
                ContractMessage(type=ANYJ, sent_by="ANY"),
                ContractMessage(type=PING, sent_by="INITIATOR"),
                # Listed but never defined: the loader checks references, a catalog read back is trusted.
                ContractMessage(type=GHOST, sent_by="ANY"),
            ],
        ),
        Contract(name=OTHER, messages=[ContractMessage(type=REQ, sent_by="ANY")]),
    ]
    queues = [Queue(name="TargetQ", max_message_bytes=LIMIT), Queue(name="OffQ", status="OFF")]
    services = [
        Service(name=TARGET, queue="TargetQ", contracts=[CONTRACT]),
        Service(name=INIT, queue="TargetQ"),  # initiator only: accepts no contract
        Service(name=OFF, queue="OffQ", contracts=[CONTRACT]),
        Service(name=NOQ, queue="Missing", contracts=[CONTRACT]),
    ]
    return Catalog(
        namespace="ns2",
        message_types={t.name: t for t in types},
        contracts={c.name: c for c in contracts},
        queues={q.name: q for q in queues},
        services={s.name: s for s in services},
    )


CATALOG = build_catalog()


def env(
    mtype: str = REQ, *, contract: str = CONTRACT, to_service: str = TARGET, to_side: str = "TARGET", seq: int = 0
) -> Envelope:
    far = INIT if to_service == TARGET else TARGET
    return Envelope(
        message_id="m1",
        conversation_id="conv",
        conversation_group_id="g",
        message_sequence_number=seq,
        message_type_name=mtype,
        service_contract_name=contract,
        from_service_name=far,
        to_service_name=to_service,
        to_side=to_side,
        from_broker="ns1",
        to_broker="ns2",
    )


def verdict(body: bytes = b"", **kw) -> Verdict:
    return check_arrival(CATALOG, env(**kw), body)


# --- SAVE -----------------------------------------------------------------------------------------


def test_a_valid_message_is_saved():
    assert verdict(b"<order id='1'/>") == Verdict(SAVE, 0, "")


def test_a_reply_to_the_initiator_is_saved_on_a_service_that_accepts_no_contract():
    # Contracts a service lists are the ones it accepts as a *target*; the initiator's service
    # receives replies on any contract it began a dialog on.
    assert verdict(b"ok", mtype=REPLY, to_service=INIT, to_side="INITIATOR") == Verdict(SAVE)


@pytest.mark.parametrize("side", ["INITIATOR", "TARGET"])
def test_an_any_message_type_is_saved_from_either_side(side):
    assert verdict(b'{"a": 1}', mtype=ANYJ, to_side=side).action == SAVE


def test_an_empty_body_is_well_formed_enough_for_xml_validation():
    assert verdict(b"", mtype=REQ).action == SAVE


def test_a_body_of_exactly_the_queues_limit_is_saved():
    assert verdict(b"x" * LIMIT, mtype=REPLY, to_side="INITIATOR").action == SAVE


@pytest.mark.parametrize("system_type", [END_DIALOG, ERROR, DIALOG_TIMER])
@pytest.mark.parametrize("contract", [CONTRACT, OTHER, UNKNOWN, DEFAULT])
@pytest.mark.parametrize("side", ["INITIATOR", "TARGET"])
def test_system_messages_are_saved_whatever_the_contract(system_type, contract, side):
    # An EndDialog or Error ends the dialog: it is never refused, not even on a contract the
    # service does not accept (OTHER, DEFAULT) or one this namespace does not define.
    body = b"not xml, and too long for the queue " * 10
    assert verdict(body, mtype=system_type, contract=contract, to_side=side) == Verdict(SAVE)


def test_the_builtin_default_contract_and_type_are_known():
    catalog = Catalog(
        namespace="n", queues={"Q": Queue(name="Q")}, services={"S": Service(name="S", queue="Q", contracts=[DEFAULT])}
    )
    e = Envelope("m", "c", "g", 0, DEFAULT, DEFAULT, "F", "S", "TARGET")
    assert check_arrival(catalog, e, b"anything").action == SAVE


# --- WAIT -----------------------------------------------------------------------------------------


def test_an_unknown_service_waits_at_the_sender_with_the_reason():
    v = verdict(to_service=ABSENT)
    assert (v.action, v.code) == (WAIT, 0)
    assert v.reason == f"The target service name '{ABSENT}' could not be found in namespace ns2."


def test_a_service_whose_queue_is_not_defined_waits():
    v = verdict(to_service=NOQ)
    assert v.action == WAIT and NOQ in v.reason


def test_a_disabled_queue_keeps_everything_waiting_even_system_messages():
    for mtype, body in [(REQ, b"<a/>"), (END_DIALOG, b""), (ERROR, b"<Error/>")]:
        v = verdict(body, mtype=mtype, to_service=OFF)
        assert v == Verdict(WAIT, 0, "The target queue 'OffQ' is disabled.")


def test_an_unknown_service_waits_rather_than_being_refused_for_its_contract():
    # Nothing about the dialog can be judged before its service exists here.
    assert verdict(b"<not closed", mtype=GHOST, contract=UNKNOWN, to_service=ABSENT).action == WAIT


# --- REFUSE, one code each ------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["INITIATOR", "TARGET"])
def test_contract_not_found(side):
    v = verdict(mtype=REQ, contract=UNKNOWN, to_side=side)
    assert (v.action, v.code) == (REFUSE, CONTRACT_NOT_FOUND) == (REFUSE, -8425)
    assert v.reason == f"The service contract '{UNKNOWN}' is not found."


def test_target_service_does_not_support_the_contract():
    v = verdict(b"<a/>", mtype=REQ, contract=OTHER, to_side="TARGET")
    assert (v.action, v.code) == (REFUSE, CONTRACT_NOT_SUPPORTED) == (REFUSE, -8408)
    assert v.reason == f"Target service '{TARGET}' does not support contract '{OTHER}'."
    # The default contract too, when the service does not list it.
    assert verdict(b"x", mtype=DEFAULT, contract=DEFAULT).code == CONTRACT_NOT_SUPPORTED


def test_contract_support_is_not_asked_of_the_initiators_service():
    assert verdict(b"<a/>", mtype=REQ, contract=OTHER, to_service=INIT, to_side="INITIATOR").action == SAVE


def test_message_type_not_found():
    v = verdict(mtype=GHOST)
    assert (v.action, v.code) == (REFUSE, MESSAGE_TYPE_NOT_FOUND) == (REFUSE, -8428)
    assert v.reason == f"The message type '{GHOST}' is not found."
    assert verdict(mtype="//never/Defined").code == MESSAGE_TYPE_NOT_FOUND


def test_message_type_not_in_contract():
    v = verdict(mtype=ORPHAN)
    assert (v.action, v.code) == (REFUSE, NOT_IN_CONTRACT) == (REFUSE, -8498)
    assert v.reason == f"The message type '{ORPHAN}' is not part of the service contract '{CONTRACT}'."


def test_sent_by_the_initiator_but_the_contract_says_target():
    v = verdict(b"ok", mtype=REPLY, to_side="TARGET")  # to the target: the initiator sent it
    assert (v.action, v.code) == (REFUSE, SENT_BY_TARGET_ONLY) == (REFUSE, -8457)
    assert "sent by the initiator" in v.reason and "SENT BY TARGET" in v.reason


def test_sent_by_the_target_but_the_contract_says_initiator():
    v = verdict(b"<a/>", mtype=REQ, to_side="INITIATOR")  # to the initiator: the target sent it
    assert (v.action, v.code) == (REFUSE, SENT_BY_INITIATOR_ONLY) == (REFUSE, -8437)
    assert "sent by the target" in v.reason and "SENT BY INITIATOR" in v.reason


def test_xml_validation_failed():
    v = verdict(b"<order>", mtype=REQ)
    assert (v.action, v.code) == (REFUSE, XML_VALIDATION_FAILED) == (REFUSE, -9616)
    assert REQ in v.reason


@pytest.mark.parametrize("mtype, body", [(ANYJ, b"{not json"), (PING, b"x")])
def test_other_validation_failed(mtype, body):
    v = verdict(body, mtype=mtype)
    assert (v.action, v.code) == (REFUSE, VALIDATION_FAILED) == (REFUSE, -8430)
    assert mtype in v.reason


def test_too_large_for_the_queue():
    v = verdict(b"x" * (LIMIT + 1), mtype=REPLY, to_side="INITIATOR")
    assert (v.action, v.code) == (REFUSE, TOO_LARGE) == (REFUSE, -9602)
    assert v.reason == f"The message has {LIMIT + 1} bytes; queue 'TargetQ' takes at most {LIMIT}."


# --- precedence ---------------------------------------------------------------------------------


def test_the_first_failing_check_gives_the_code():
    big_bad_xml = b"<" * (LIMIT + 1)
    # Contract unknown beats everything after it.
    assert verdict(big_bad_xml, mtype=GHOST, contract=UNKNOWN).code == CONTRACT_NOT_FOUND
    # Not supported beats an unknown type.
    assert verdict(big_bad_xml, mtype=GHOST, contract=OTHER).code == CONTRACT_NOT_SUPPORTED
    # Wrong side beats size and body.
    assert verdict(big_bad_xml, mtype=REQ, to_side="INITIATOR").code == SENT_BY_INITIATOR_ONLY
    # Size beats the body's validation.
    assert verdict(big_bad_xml, mtype=REQ).code == TOO_LARGE


# --- the property ---------------------------------------------------------------------------------

SERVICES = [TARGET, INIT, OFF, NOQ, ABSENT]
TYPES = [REQ, REPLY, ANYJ, PING, ORPHAN, GHOST, DEFAULT, END_DIALOG, ERROR, DIALOG_TIMER]
CONTRACTS = [CONTRACT, OTHER, UNKNOWN, DEFAULT]
BODIES = [b"", b"<a/>", b"<a>", b'{"k": 1}', b"{", b"plain", b"<b>" + b"y" * LIMIT + b"</b>"]
CODES = {
    CONTRACT_NOT_FOUND,
    CONTRACT_NOT_SUPPORTED,
    MESSAGE_TYPE_NOT_FOUND,
    NOT_IN_CONTRACT,
    SENT_BY_TARGET_ONLY,
    SENT_BY_INITIATOR_ONLY,
    VALIDATION_FAILED,
    XML_VALIDATION_FAILED,
    TOO_LARGE,
}


def body_is_valid(mtype: str, body: bytes) -> bool:
    try:
        validate_body(mtype, CATALOG.message_types[mtype].validation, body)
    except MessageValidationError:
        return False
    return True


@settings(max_examples=500)
@given(
    st.sampled_from(SERVICES),
    st.sampled_from(TYPES),
    st.sampled_from(CONTRACTS),
    st.sampled_from(["INITIATOR", "TARGET"]),
    st.sampled_from(BODIES),
)
def test_the_verdict_agrees_with_the_catalogs_own_rules(service, mtype, contract, side, body):
    v = verdict(body, mtype=mtype, contract=contract, to_service=service, to_side=side)
    assert v.action in (SAVE, WAIT, REFUSE)
    assert (v.code in CODES) == (v.action == REFUSE) and (v.code == 0) == (v.action != REFUSE)
    assert (v.reason == "") == (v.action == SAVE)
    here = CATALOG.services.get(service)
    if here is None or here.queue not in CATALOG.queues or CATALOG.queues[here.queue].status == "OFF":
        assert v.action == WAIT
        return
    assert v.action != WAIT  # a service that is here never keeps its sender waiting
    if mtype in (END_DIALOG, ERROR, DIALOG_TIMER):
        assert v.action == SAVE
        return
    sender = "INITIATOR" if side == "TARGET" else "TARGET"
    acceptable = (
        contract in CATALOG.contracts
        and (side == "INITIATOR" or CATALOG.service_accepts(service, contract))
        and mtype in CATALOG.message_types
        and CATALOG.may_send(contract, mtype, sender)
        and len(body) <= CATALOG.queues[here.queue].max_message_bytes
        and body_is_valid(mtype, body)
    )
    assert (v.action == SAVE) == acceptable, v
