"""CREATE BROKER PRIORITY (core/catalog/priorities.py): the match precedence against Service
Broker's eight-row table, the loader's checks, the catalog records, and HONOR_BROKER_PRIORITY's
order of a transmitter's due messages (core/routing/transmission.by_priority)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.priorities import ANY, BrokerPriority, conversation_priority
from kbroker.core.dialogs.conversation_endpoint import new_target_endpoint
from kbroker.core.routing.transmission import Outgoing, by_priority
from kbroker.errors import DefinitionError

# Service Broker's match precedence, most specific first: (contract, local, remote) named (True) or ANY.
PRECEDENCE = [
    (True, True, True),
    (True, True, False),
    (True, False, True),
    (True, False, False),
    (False, True, True),
    (False, True, False),
    (False, False, True),
    (False, False, False),
]


def priority(name: str, named: tuple[bool, bool, bool], level: int) -> BrokerPriority:
    c, loc, rem = named
    return BrokerPriority(
        name=name,
        contract="C" if c else ANY,
        local_service="L" if loc else ANY,
        remote_service="R" if rem else ANY,
        priority=level,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PRECEDENCE), unique=True))
def test_the_most_specific_priority_wins_in_service_brokers_order(present: list[tuple[bool, bool, bool]]) -> None:
    ps = [priority(f"p{PRECEDENCE.index(n)}", n, PRECEDENCE.index(n) + 1) for n in present]
    got = conversation_priority(ps, "C", "L", "R")
    best = min((PRECEDENCE.index(n) for n in present), default=None)
    assert got == (None if best is None else best + 1)


def test_a_priority_naming_something_else_does_not_match() -> None:
    ps = [priority("p", (True, True, True), 9)]
    for contract, local, remote in itertools.product(["C", "X"], ["L", "X"], ["R", "X"]):
        expected = 9 if (contract, local, remote) == ("C", "L", "R") else None
        assert conversation_priority(ps, contract, local, remote) == expected
    assert conversation_priority([], "C", "L", "R") is None


def test_a_target_endpoint_keeps_the_priorities_it_was_created_with() -> None:
    ep = new_target_endpoint("c", "g", "fg", "//b", "//a", "C", priorities=(8, 3))
    assert (ep.priority, ep.far_priority, ep.send_priority) == (8, 3, 3)
    assert replace(ep, remote=True).send_priority == 8  # a remote dialog's transmitter orders by its own
    assert type(ep).from_json(ep.to_json()) == ep


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return path


BASE = """
queues: [{name: Q}]
services: [{name: //L, queue: Q, contracts: [DEFAULT]}]
"""


def test_the_loader_reads_priorities_and_the_honor_option(tmp_path: Path) -> None:
    c = load_definitions(
        [
            write(
                tmp_path,
                BASE
                + """
broker_priorities:
  - {name: High, contract: DEFAULT, local_service: //L, remote_service: //far, priority: 9}
  - {name: Rest}
database_options: [{name: honor_broker_priority, value: ON}]
""",
            )
        ],
        "ns",
    )
    assert c.broker_priorities["High"].priority == 9 and c.broker_priorities["Rest"].priority == 5
    assert c.endpoint_priority("DEFAULT", "//L", "//far") == 9
    assert c.endpoint_priority("DEFAULT", "//L", "//other") == 5  # Rest: ANY, ANY, ANY
    assert c.honor_broker_priority


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("{name: P, contract: Nope}", "contract 'Nope' is not defined"),
        ("{name: P, local_service: //nope}", "service '//nope' is not defined"),
        ("{name: P, priority: 11}", "priority"),
        ("{name: P, priority: 0}", "priority"),
        ("{name: P, level: 3}", "unknown field 'level'"),
        ("{name: P}\n  - {name: P2}", "has the contract and services of broker priority 'P'"),
    ],
)
def test_the_loader_refuses_a_bad_priority(tmp_path: Path, entry: str, reason: str) -> None:
    with pytest.raises(DefinitionError, match=reason):
        load_definitions([write(tmp_path, BASE + f"broker_priorities:\n  - {entry}\n")], "ns")


def test_a_bad_database_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="name"):
        load_definitions([write(tmp_path, "database_options: [{name: trustworthy, value: ON}]\n")], "ns")


def test_priorities_travel_as_catalog_records() -> None:
    p = BrokerPriority(name="High", contract="C", priority=9)
    assert catalog_record(b"broker_priority/High", p.model_dump_json().encode()) == ("broker_priorities", "High", p)
    assert catalog_record(b"database_option/honor_broker_priority", None) == (
        "database_options",
        "honor_broker_priority",
        None,
    )


# --- HONOR_BROKER_PRIORITY: the transmitter's order ----------------------------------------------


def out(offset: int, handle: str, level: int) -> Outgoing:
    return Outgoing(0, offset, handle, "TARGET", offset, "//t", None, "//i", "m", "C", handle, 0.0, 1, priority=level)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 10)), max_size=30))
def test_higher_priority_dialogs_go_first_each_in_its_own_order(sends: list[tuple[str, int]]) -> None:
    due = [out(i, h, p) for i, (h, p) in enumerate(sends)]
    got = by_priority(due)
    assert sorted(m.offset for m in got) == list(range(len(due)))  # nothing lost or repeated
    for h in "abcd":  # each dialog's messages in their order
        assert [m.offset for m in got if m.handle == h] == [m.offset for m in due if m.handle == h]
    tops = [max(m.priority for m in due if m.handle == h) for h in dict.fromkeys(m.handle for m in got)]
    assert tops == sorted(tops, reverse=True)  # dialogs by their highest priority
