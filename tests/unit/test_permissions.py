"""Service Broker's permissions as Kafka ACLs (core/security/permissions.py): each permission's ACLs, read
back from ACLs, revoked, parsed; and a round trip permissions -> ACLs -> permissions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.security.acl_bindings import AclBinding, allowed
from kbroker.core.security.permissions import (
    ALTER,
    CATALOG,
    CONTROL,
    DENY,
    QUEUE,
    RECEIVE,
    SEND,
    SERVICE,
    Objects,
    Permission,
    bindings,
    bindings_of,
    held,
    own_bindings,
    parse,
    revoke_plan,
)
from kbroker.errors import InvalidArgumentError

NS = "sales"
ALICE = "User:alice"
OBJECTS = Objects(
    NS,
    {"orders": "OrderQueue", "billing": "BillQueue", "audit": "BillQueue"},
    frozenset({"OrderQueue", "BillQueue", "Idle"}),
)


def topic(q: str) -> str:
    return names.queue_topic(NS, q)


def may(acls, op: str, rtype: str, name: str) -> bool:
    """As Kafka decides: an ALLOW and no DENY (Kafka's DENY wins)."""
    denied = any(b.permission == "DENY" and b.operation == op and b.covers(rtype, name) for b in acls)
    return allowed(list(acls), ALICE, op, rtype, name) and not denied


def test_send_on_a_service_writes_its_queue_and_its_secondary_queues_only():
    acls = bindings(Permission(ALICE, SEND, SERVICE, "orders"), OBJECTS)
    assert may(acls, "WRITE", "TOPIC", topic("OrderQueue"))
    assert may(acls, "WRITE", "TOPIC", topic("OrderQueue") + ".instance1")
    assert not may(acls, "WRITE", "TOPIC", topic("BillQueue"))
    assert not may(acls, "READ", "TOPIC", topic("OrderQueue"))  # SEND is not RECEIVE
    assert may(acls, "WRITE", "TOPIC", names.endpoints_topic(NS))  # what a sender needs besides
    assert may(acls, "WRITE", "TRANSACTIONAL_ID", names.prefix(NS) + "some-uuid")
    assert not may(acls, "WRITE", "TOPIC", names.catalog_topic(NS))  # a sender never writes the catalog
    assert all(b.permission == "ALLOW" and b.principal == ALICE for b in acls)


def test_receive_on_a_queue_reads_its_topic_and_group_and_writes_no_queue():
    acls = bindings(Permission(ALICE, RECEIVE, QUEUE, "OrderQueue"), OBJECTS)
    assert may(acls, "READ", "TOPIC", topic("OrderQueue")) and may(acls, "READ", "GROUP", topic("OrderQueue"))
    assert not may(acls, "READ", "TOPIC", topic("BillQueue")) and not may(acls, "READ", "GROUP", topic("BillQueue"))
    assert not may(acls, "WRITE", "TOPIC", topic("OrderQueue"))
    assert not may(acls, "WRITE", "TOPIC", names.catalog_topic(NS))


def test_alter_writes_the_catalog_and_control_on_the_catalog_applies():
    alter = bindings(Permission(ALICE, ALTER, QUEUE, "OrderQueue"), OBJECTS)
    assert may(alter, "ALTER_CONFIGS", "TOPIC", topic("OrderQueue"))
    assert may(alter, "WRITE", "TOPIC", names.catalog_topic(NS))
    assert not may(alter, "ALTER_CONFIGS", "TOPIC", topic("BillQueue"))
    owner = bindings(Permission(ALICE, CONTROL, CATALOG, NS), OBJECTS)
    assert may(owner, "CREATE", "TOPIC", topic("NewQueue")) and may(owner, "WRITE", "TOPIC", names.catalog_topic(NS))
    assert not may(owner, "CREATE", "TOPIC", names.queue_topic("other", "Q"))
    # ALTER ON SERVICE is ALTER ON QUEUE of its queue
    assert bindings(Permission(ALICE, ALTER, SERVICE, "orders"), OBJECTS) == alter


def test_deny_names_only_the_object_and_wins_over_a_grant():
    deny = bindings(Permission(ALICE, SEND, SERVICE, "orders", DENY), OBJECTS)
    assert {b.permission for b in deny} == {"DENY"}
    assert {b.name for b in deny} == {topic("OrderQueue"), topic("OrderQueue") + "."}
    both = bindings(Permission(ALICE, CONTROL, QUEUE, "OrderQueue"), OBJECTS) | deny
    assert not may(both, "WRITE", "TOPIC", topic("OrderQueue"))
    assert may(both, "READ", "TOPIC", topic("OrderQueue"))  # the rest of CONTROL stays
    catalog_deny = bindings(Permission(ALICE, CONTROL, CATALOG, NS, DENY), OBJECTS)
    assert not any(b.operation.startswith("DESCRIBE") for b in catalog_deny)  # would hide every topic


def test_held_reads_back_what_was_granted_and_leaves_out_the_implied():
    acls = bindings_of(
        [
            Permission(ALICE, CONTROL, SERVICE, "orders"),
            Permission(ALICE, SEND, SERVICE, "orders"),
            Permission(ALICE, RECEIVE, QUEUE, "Idle", DENY),
        ],
        OBJECTS,
    )
    stray = AclBinding(ALICE, "READ", "TOPIC", "LITERAL", "elsewhere")
    shown, raw = held(acls | {stray, AclBinding("User:bob", "READ", "TOPIC", "LITERAL", "x")}, ALICE, OBJECTS)
    assert shown == sorted(
        [Permission(ALICE, CONTROL, SERVICE, "orders"), Permission(ALICE, RECEIVE, QUEUE, "Idle", DENY)]
    )
    assert raw == [stray]


def test_a_permission_with_one_acl_missing_is_not_held():
    acls = bindings(Permission(ALICE, SEND, SERVICE, "orders"), OBJECTS)
    for b in acls:
        shown, raw = held(acls - {b}, ALICE, OBJECTS)
        assert shown == [] and set(raw) == acls - {b}


def test_services_sharing_a_queue_share_send_and_revoke_says_so():
    acls = bindings(Permission(ALICE, SEND, SERVICE, "billing"), OBJECTS)
    shown, _ = held(acls, ALICE, OBJECTS)
    assert {p.name for p in shown} == {"billing", "audit"}  # one topic: Kafka cannot tell them apart
    gone = revoke_plan(Permission(ALICE, SEND, SERVICE, "billing"), acls, OBJECTS)
    assert gone == acls


def test_revoke_keeps_the_base_another_permission_needs_and_removes_a_deny():
    send = Permission(ALICE, SEND, SERVICE, "orders")
    other = Permission(ALICE, SEND, SERVICE, "billing")
    deny = Permission(ALICE, SEND, SERVICE, "orders", DENY)
    acls = bindings_of([send, other, deny], OBJECTS)
    left = acls - revoke_plan(send, acls, OBJECTS)
    assert held(left, ALICE, OBJECTS) == (sorted([Permission(ALICE, SEND, SERVICE, "audit"), other]), [])
    assert not any(b.permission == "DENY" for b in left)


def test_parse_reads_t_sql():
    assert parse("GRANT", ["send", "on", "SERVICE::orders", "to", "alice"], NS) == [
        Permission(ALICE, SEND, SERVICE, "orders")
    ]
    assert parse("DENY", ["RECEIVE,", "ALTER", "ON", "QUEUE::[OrderQueue]", "TO", "User:alice"], NS) == [
        Permission(ALICE, RECEIVE, QUEUE, "OrderQueue", DENY),
        Permission(ALICE, ALTER, QUEUE, "OrderQueue", DENY),
    ]
    assert parse("GRANT", "CONTROL ON CATALOG::current FROM User:alice".split(), NS)[0].name == NS
    for bad in (
        "SEND TO alice",
        "RECEIVE ON SERVICE::orders TO alice",
        "SEND ON TABLE::x TO alice",
        "SEND ON SERVICE::x TO User:*",
    ):
        with pytest.raises(InvalidArgumentError):
            parse("GRANT", bad.split(), NS)
    with pytest.raises(InvalidArgumentError, match="not a service of namespace"):
        bindings(Permission(ALICE, SEND, SERVICE, "elsewhere"), OBJECTS)
    with pytest.raises(InvalidArgumentError, match="CATALOG::sales"):
        bindings(Permission(ALICE, CONTROL, CATALOG, "other"), OBJECTS)


# --- the round trip ------------------------------------------------------------------------------

QUEUES = ["Q1", "Q2", "Q_3", "Q.4"]


@st.composite
def catalogs_and_permissions(draw, own_queues: bool):
    services = [f"s{i}" for i in range(draw(st.integers(1, 4)))]
    n = len(services)
    queues = QUEUES[:n] if own_queues else draw(st.lists(st.sampled_from(QUEUES[:2]), min_size=n, max_size=n))
    objects = Objects(NS, dict(zip(services, queues)), frozenset(queues) | {"Spare"})
    perm = st.one_of(
        st.builds(
            Permission,
            st.just(ALICE),
            st.sampled_from([SEND, CONTROL]),
            st.just(SERVICE),
            st.sampled_from(services),
            st.sampled_from(["GRANT", DENY]),
        ),
        st.builds(
            Permission,
            st.just(ALICE),
            st.sampled_from([RECEIVE, ALTER, CONTROL]),
            st.just(QUEUE),
            st.sampled_from(sorted(objects.queues)),
            st.sampled_from(["GRANT", DENY]),
        ),
        st.builds(
            Permission,
            st.just(ALICE),
            st.just(CONTROL),
            st.just(CATALOG),
            st.just(NS),
            st.sampled_from(["GRANT", DENY]),
        ),
    )
    return objects, draw(st.sets(perm, max_size=6))


@settings(max_examples=150, deadline=None)
@given(catalogs_and_permissions(own_queues=False))
def test_round_trip_shows_what_is_enforced(case):
    """Whatever was granted, what is read back gives exactly the same ACLs, none left raw, and
    every permission granted is held or implied by one held."""
    objects, perms = case
    acls = bindings_of(perms, objects)
    shown, raw = held(acls, ALICE, objects)
    assert raw == [] and bindings_of(shown, objects) == acls
    for p in perms:
        assert any(bindings(p, objects) <= bindings(q, objects) for q in shown)


@settings(max_examples=150, deadline=None)
@given(catalogs_and_permissions(own_queues=True))
def test_round_trip_is_exact_for_each_permission_and_stable_for_any_set(case):
    """One permission reads back as itself (each service on a queue of its own); a set reads back
    as its normal form (SEND and ALTER on one service's queue are CONTROL ON SERVICE), which
    reads back as itself."""
    objects, perms = case
    for p in perms:
        assert held(bindings(p, objects), ALICE, objects) == ([p], [])
    normal, _ = held(bindings_of(perms, objects), ALICE, objects)
    assert held(bindings_of(normal, objects), ALICE, objects) == (normal, [])


@settings(max_examples=100, deadline=None)
@given(catalogs_and_permissions(own_queues=False), st.data())
def test_revoke_takes_the_permission_away_and_leaves_the_others_that_do_not_share_its_acls(case, data):
    objects, perms = case
    if not perms:
        return
    gone = data.draw(st.sampled_from(sorted(perms)))
    acls = bindings_of(perms, objects)
    left = acls - revoke_plan(gone, acls, objects)
    shown, _ = held(left, ALICE, objects)
    assert not any(bindings(gone, objects) <= bindings(q, objects) for q in shown if q.state == gone.state)
    own = own_bindings(replace(gone, state="GRANT"), objects) | own_bindings(replace(gone, state=DENY), objects)
    for p in perms:
        same = (p.action, p.cls, p.name) == (gone.action, gone.cls, gone.name)  # REVOKE takes grant and deny
        if not same and not own & bindings(p, objects):  # shares nothing of its own with the revoked one
            assert any(bindings(p, objects) <= bindings(q, objects) for q in shown), p


# --- namespaces whose topics could collide in Kafka ---------------------------------------------------


@pytest.mark.parametrize(
    "ns, other",
    [
        ("a_queue", "a"),
        ("a_queue_x", "a"),
        ("a_b_tqueue", "a_b"),
        ("sales", None),
        ("queue_x", None),
        ("my_queues", None),
        ("a-queue", None),
    ],
)
def test_a_namespace_in_another_ones_queue_space_is_named(ns, other):
    found = names.shadowed_namespace(ns)
    assert (found[0] if found else None) == other


@settings(max_examples=300, deadline=None)
@given(
    st.from_regex(r"[a-z]{1,3}(_[a-z]{1,6}){0,3}", fullmatch=True),
    st.from_regex(r"[a-z]{1,3}(_[a-z]{1,6}){0,3}", fullmatch=True),
    st.sampled_from(["catalog", "queue.Q", "queue.Q.i1", "tqueue.T", "monitor-events", "queue.x_catalog"]),
    st.sampled_from(["catalog", "queue.Q", "queue.catalog", "queue.x.catalog", "tqueue.T.m1", "queue.b_queue"]),
)
def test_namespaces_apply_accepts_never_share_a_topic_in_kafkas_form(a, b, rest_a, rest_b):
    if a == b or names.shadowed_namespace(a) or names.shadowed_namespace(b):
        return
    assert names.kafka_form(names.prefix(a) + rest_a) != names.kafka_form(names.prefix(b) + rest_b)


def test_a_refused_send_carries_service_brokers_error_number():
    from kbroker.errors import PermissionDeniedError, SendPermissionDeniedError

    exc = SendPermissionDeniedError("orders", "kbroker.sales.queue.OrderQueue")
    assert isinstance(exc, PermissionDeniedError) and exc.number == -8494 and not exc.retriable
    named = exc.naming("User:alice")
    assert isinstance(named, SendPermissionDeniedError) and str(named) == (
        "permission denied: User:alice may not WRITE topic kbroker.sales.queue.OrderQueue "
        "(error -8494: no SEND permission on service 'orders')"
    )


def test_a_statement_that_does_not_parse_is_one_line_before_any_cluster_is_looked_for():
    from click.testing import CliRunner

    from kbroker.cli import main

    out = CliRunner().invoke(main, ["grant", "SEND", "TO", "alice", "--bootstrap", "127.0.0.1:1", "--namespace", NS])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        "kbroker: error: 'SEND TO alice': expected PERMISSION ON CLASS::name TO principal, e.g. SEND ON "
        "SERVICE::orders TO User:alice"
    ]
