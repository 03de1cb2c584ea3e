"""DROP's pure rules (core/catalog/drops.py): what refuses a drop, the catalog after one, and a
contract's messages fixed once published; a property over generated catalogs that a drop is
refused exactly when something names the object and never leaves a dangling reference."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.catalog.drops import DROP_KINDS, check_contracts_fixed, dropped, merged, plan_drops, users_of
from kbroker.core.catalog.loader import _check_references, load_definitions
from kbroker.core.catalog.models import (
    BUILTIN_CONTRACTS,
    BUILTIN_MESSAGE_TYPES,
    DEFAULT,
    END_DIALOG,
    Catalog,
)
from kbroker.errors import CatalogError, DefinitionError
from kbroker.errors_catalog import ContractFixedError, DropNotFoundError, DropRefusedError

XSD = '<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema"><xsd:element name="a"/></xsd:schema>'


def catalog(**objects: list[dict[str, Any]]) -> Catalog:
    return Catalog.model_validate(
        {"namespace": "ns", **{field: {o["name"]: o for o in items} for field, items in objects.items()}}
    )


SAMPLE = dict(
    xml_schema_collections=[{"name": "X", "schemas": [XSD]}],
    message_types=[{"name": "M", "validation": "VALID_XML", "schema_collection": "X"}, {"name": "N"}],
    contracts=[{"name": "C", "messages": [{"type": "M", "sent_by": "INITIATOR"}]}],
    queues=[{"name": "Q"}, {"name": "Empty"}],
    services=[{"name": "S", "queue": "Q", "contracts": ["C"]}],
    routes=[{"name": "R", "service_name": "S", "address": "LOCAL"}],
    broker_priorities=[{"name": "P", "contract": "C", "local_service": "S", "priority": 8}],
    remote_service_bindings=[{"name": "B", "to_service": "S", "user": "u"}],  # a far S: S's drop is not refused
)


@pytest.mark.parametrize(
    ("kind", "name", "users"),
    [
        ("message-type", "M", ("contract C",)),
        ("contract", "C", ("broker priority P", "service S")),
        ("queue", "Q", ("service S",)),
        ("xml-schema-collection", "X", ("message type M",)),
        ("service", "S", ("broker priority P", "route R")),
    ],
)
def test_a_used_object_is_refused_naming_its_users(kind: str, name: str, users: tuple[str, ...]) -> None:
    with pytest.raises(DropRefusedError) as info:
        dropped(catalog(**SAMPLE), kind, name)
    assert info.value.users == users
    assert isinstance(info.value, CatalogError)
    assert f"cannot drop {DROP_KINDS[kind][1]} {name!r}: it is " in str(info.value)
    assert users[0] in str(info.value)


@pytest.mark.parametrize(
    ("kind", "name", "field"),
    [
        ("message-type", "N", "message_types"),
        ("queue", "Empty", "queues"),
        ("route", "R", "routes"),
        ("broker-priority", "P", "broker_priorities"),
        ("remote-service-binding", "B", "remote_service_bindings"),
    ],
)
def test_an_unused_object_goes(kind: str, name: str, field: str) -> None:
    after = dropped(catalog(**SAMPLE), kind, name)
    assert name not in getattr(after, field)
    assert len(getattr(after, field)) == len(getattr(catalog(**SAMPLE), field)) - 1


def test_dropping_in_order_empties_the_catalog() -> None:
    c = catalog(**SAMPLE)
    for kind, name in [
        ("remote-service-binding", "B"),
        ("broker-priority", "P"),
        ("route", "R"),
        ("service", "S"),
        ("queue", "Q"),
        ("contract", "C"),
        ("message-type", "M"),
        ("xml-schema-collection", "X"),
    ]:
        c = dropped(c, kind, name)
    assert not c.services and not c.xml_schema_collections and not c.remote_service_bindings and "C" not in c.contracts
    assert set(c.message_types) == set(BUILTIN_MESSAGE_TYPES) | {"N"}


@pytest.mark.parametrize(
    ("kind", "name"), [("message-type", DEFAULT), ("message-type", END_DIALOG), ("contract", DEFAULT)]
)
def test_a_built_in_cannot_be_dropped(kind: str, name: str) -> None:
    with pytest.raises(DropRefusedError, match="it is a built-in object"):
        dropped(catalog(), kind, name)


def test_a_missing_object_is_named() -> None:
    with pytest.raises(DropNotFoundError, match="cannot drop queue 'Nope': it does not exist in namespace 'ns'"):
        dropped(catalog(), "queue", "Nope")


def test_a_remote_route_does_not_hold_its_service() -> None:
    c = catalog(
        queues=[{"name": "Q"}],
        services=[{"name": "S", "queue": "Q"}],
        routes=[{"name": "R", "service_name": "S", "address": "kafka://h:9092/other"}],
    )
    assert users_of(c, "services", "S") == ()
    assert "S" not in dropped(c, "service", "S").services


def test_a_contract_keeps_its_messages() -> None:
    old = catalog(**SAMPLE)
    same_reordered = catalog(
        message_types=SAMPLE["message_types"],
        xml_schema_collections=SAMPLE["xml_schema_collections"],
        contracts=[{"name": "C", "messages": [{"type": "M", "sent_by": "INITIATOR"}]}],
    )
    check_contracts_fixed(old, same_reordered)
    changed = catalog(
        message_types=SAMPLE["message_types"],
        xml_schema_collections=SAMPLE["xml_schema_collections"],
        contracts=[{"name": "C", "messages": [{"type": "M", "sent_by": "ANY"}, {"type": "N", "sent_by": "TARGET"}]}],
    )
    with pytest.raises(ContractFixedError) as info:
        check_contracts_fixed(old, changed)
    assert isinstance(info.value, DefinitionError)
    assert info.value.contract == "C" and info.value.obj == "contract C"
    assert "there is no ALTER CONTRACT" in str(info.value) and "M SENT BY INITIATOR" in str(info.value)
    check_contracts_fixed(catalog(), changed)  # a new contract is not a change


# --- the property ---------------------------------------------------------------------------------


@st.composite
def catalogs(draw: st.DrawFn) -> Catalog:
    xs = [f"X{i}" for i in range(draw(st.integers(0, 2)))]
    mts = []
    for i in range(draw(st.integers(0, 4))):
        x = draw(st.none() | st.sampled_from(xs)) if xs else None
        mts.append({"name": f"M{i}", **({"validation": "VALID_XML", "schema_collection": x} if x else {})})
    types = [m["name"] for m in mts] + [DEFAULT]
    contracts = []
    for i in range(draw(st.integers(0, 3))):
        chosen = draw(st.lists(st.sampled_from(types), min_size=1, max_size=3, unique=True))
        sides = ["INITIATOR"] + draw(st.lists(st.sampled_from(["INITIATOR", "TARGET", "ANY"]), min_size=2, max_size=2))
        msgs = [{"type": t, "sent_by": s} for t, s in zip(chosen, sides, strict=False)]
        contracts.append({"name": f"C{i}", "messages": msgs})
    queues = [{"name": f"Q{i}"} for i in range(draw(st.integers(0, 3)))]
    services = []
    for i in range(draw(st.integers(0, 3)) if queues else 0):
        q = draw(st.sampled_from([q["name"] for q in queues]))
        cs = draw(st.lists(st.sampled_from([c["name"] for c in contracts] + [DEFAULT]), max_size=2, unique=True))
        services.append({"name": f"S{i}", "queue": q, "contracts": cs})
    routes = []
    for i in range(draw(st.integers(0, 2))):
        svc = draw(st.none() | st.sampled_from([s["name"] for s in services] or ["elsewhere"]))
        local = svc != "elsewhere" and draw(st.booleans())
        address = "LOCAL" if local else "kafka://h:9092/other"
        routes.append({"name": f"R{i}", "service_name": svc, "address": address})
    priorities = []
    for i in range(draw(st.integers(0, 2))):
        contract = draw(st.sampled_from(["ANY", DEFAULT] + [c["name"] for c in contracts]))
        local = draw(st.sampled_from(["ANY"] + [s["name"] for s in services]))
        priorities.append({"name": f"P{i}", "contract": contract, "local_service": local, "remote_service": f"r{i}"})
    bindings = [{"name": f"B{i}", "to_service": f"r{i}", "user": "u"} for i in range(draw(st.integers(0, 2)))]
    return catalog(
        remote_service_bindings=bindings,
        broker_priorities=priorities,
        xml_schema_collections=[{"name": x, "schemas": [XSD]} for x in xs],
        message_types=mts,
        contracts=contracts,
        queues=queues,
        services=services,
        routes=routes,
    )


def references_hold(c: Catalog) -> bool:
    objects: dict[str, dict[str, Any]] = {
        "message_types": {k: v for k, v in c.message_types.items() if k not in BUILTIN_MESSAGE_TYPES},
        "contracts": {k: v for k, v in c.contracts.items() if k not in BUILTIN_CONTRACTS},
        "xml_schema_collections": dict(c.xml_schema_collections),
        "queues": dict(c.queues),
        "services": dict(c.services),
        "routes": dict(c.routes),
        "broker_endpoints": {},
        "broker_priorities": dict(c.broker_priorities),
        "remote_service_bindings": dict(c.remote_service_bindings),
    }
    try:
        _check_references(objects, defaultdict(str))
    except DefinitionError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(catalogs(), st.data())
def test_a_drop_is_refused_exactly_when_referenced_and_never_dangles(c: Catalog, data: st.DataObject) -> None:
    assert references_hold(c)
    candidates = [
        (kind, name)
        for kind, (field, _) in DROP_KINDS.items()
        for name in getattr(c, field)
        if not (field == "message_types" and name in BUILTIN_MESSAGE_TYPES)
        and not (field == "contracts" and name in BUILTIN_CONTRACTS)
    ]
    if not candidates:
        return
    kind, name = data.draw(st.sampled_from(candidates))
    field = DROP_KINDS[kind][0]
    without = c.model_copy(update={field: {k: v for k, v in getattr(c, field).items() if k != name}})
    try:
        after = dropped(c, kind, name)
    except DropRefusedError as exc:
        assert exc.users  # refused only for a user ...
        assert not references_hold(without)  # ... whose reference the drop would have left dangling
        return
    assert after == without
    assert references_hold(after)


# --- apply's drop: list ------------------------------------------------------------------------


def test_a_drop_list_is_read_and_checked(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text("queues: [{name: Q}]\ndrop: [{kind: service, name: S}, {kind: queue, name: Old}]\n")
    assert load_definitions([f], "ns").drops == [("service", "S"), ("queue", "Old")]
    for text, reason in [
        ("drop: [{kind: table, name: T}]", "drop #1: kind 'table' is not one of message-type"),
        ("drop: [{name: T}]", "drop #1: must be a mapping {kind: ..., name: ...}"),
        ("queues: [{name: Q}]\ndrop: [{kind: queue, name: Q}]", "queue Q: is both defined and dropped"),
    ]:
        f.write_text(text + "\n")
        with pytest.raises(DefinitionError, match=re.escape(reason)):
            load_definitions([f], "ns")


def test_plan_drops_orders_users_first_and_skips_what_is_gone() -> None:
    drops = [("xml-schema-collection", "X"), ("queue", "Q"), ("message-type", "M"), ("contract", "C")]
    drops += [("service", "S"), ("route", "R"), ("queue", "Gone"), ("broker-priority", "P")]
    drops += [("remote-service-binding", "B")]
    assert plan_drops(catalog(**SAMPLE), drops) == [
        ("remote-service-binding", "B"),
        ("broker-priority", "P"),
        ("route", "R"),
        ("service", "S"),
        ("queue", "Q"),
        ("contract", "C"),
        ("message-type", "M"),
        ("xml-schema-collection", "X"),
    ]
    with pytest.raises(DropRefusedError, match="used by service S"):
        plan_drops(catalog(**SAMPLE), [("queue", "Q"), ("route", "R")])  # S still on Q
    files = catalog(queues=[{"name": "Q2"}], services=[{"name": "S", "queue": "Q2", "contracts": ["C"]}])
    after = merged(catalog(**SAMPLE), files)  # the files move S to Q2: Q may go in the same apply
    assert after.services["S"].queue == "Q2"
    assert plan_drops(after, [("queue", "Q")]) == [("queue", "Q")]


def test_the_command_line_offers_every_kind() -> None:
    from kbroker.cli.catalog import DROP_CHOICES

    assert DROP_CHOICES == list(DROP_KINDS)
