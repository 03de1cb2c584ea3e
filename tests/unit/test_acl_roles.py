"""The roles' ACL plans (core/security/acl_roles.py): each role is allowed what its code paths touch in
its namespace and nothing of another namespace; the transport's installer/runner split, and the
runner's sends to queues of other namespaces (`--sends-to`); the kafka-acls.sh lines; and the Kafka
side's conversion (kafka/security/acls.py)."""

from __future__ import annotations

import pytest

from kbroker.core import names
from kbroker.core.security.acl_bindings import AclBinding, allowed, check_principal
from kbroker.core.security.acl_roles import ROLES, bindings, rules, transport_split
from kbroker.core.transport.delayed import delayed_topic
from kbroker.core.transport.endpoint import transport_queue_topic

NS = "sales"
P = names.prefix(NS)


@pytest.mark.parametrize("role", list(ROLES))
def test_every_role_stays_in_its_namespace(role):
    """Nothing of namespace `salesforce` (whose names start with `kbroker.sales`) nor of any other."""
    acls = bindings(role, "User:a", NS)
    assert acls and len(acls) == len(set(acls))
    for a in acls:
        assert a.name.startswith(P), a
        assert a.resource_type != "CLUSTER" and a.permission == "ALLOW" and a.host == "*"
    for op in ("READ", "WRITE", "CREATE", "DESCRIBE"):
        for kind in ("TOPIC", "GROUP", "TRANSACTIONAL_ID"):
            assert not allowed(acls, "User:a", op, kind, "kbroker.salesforce.queue.Q")
            assert not allowed(acls, "User:a", op, kind, "kbroker.other.catalog")


def test_routes_reach_only_the_named_namespaces():
    acls = bindings("router", "User:r", NS, routes_to=["billing"])
    assert allowed(acls, "User:r", "WRITE", "TOPIC", names.inbound_topic("billing"))
    assert allowed(acls, "User:r", "READ", "TOPIC", names.acks_topic("billing"))
    assert allowed(acls, "User:r", "DESCRIBE", "GROUP", names.reader_group("billing"))
    assert not allowed(acls, "User:r", "WRITE", "TOPIC", names.queue_topic("billing", "Q"))
    assert not allowed(acls, "User:r", "READ", "TOPIC", names.inbound_topic("billing"))
    worker = bindings("worker", "User:w", NS, routes_to=["billing"])
    assert allowed(worker, "User:w", "WRITE", "TOPIC", names.inbound_topic("billing"))


def test_what_tells_the_roles_apart():
    def can(role, op, kind, name):
        return allowed(bindings(role, "User:x", NS), "User:x", op, kind, name)

    queue = names.queue_topic(NS, "Orders")
    assert can("sender", "WRITE", "TOPIC", queue) and not can("sender", "READ", "TOPIC", queue)
    assert can("reader", "READ", "TOPIC", queue) and not can("reader", "WRITE", "TOPIC", queue)
    assert can("reader", "READ", "GROUP", names.queue_group(NS, "Orders"))
    assert can("app", "READ", "TOPIC", queue) and can("app", "WRITE", "TOPIC", queue)
    for role in ("sender", "reader", "app", "analytics", "router", "transport-runner"):
        assert not can(role, "CREATE", "TOPIC", names.catalog_topic(NS)), role
        assert not can(role, "DELETE", "TOPIC", queue), role
    assert can("worker", "DELETE", "TOPIC", queue)  # the reclaim's DeleteRecords
    assert can("deployer", "CREATE", "TOPIC", queue) and can("deployer", "WRITE", "TOPIC", names.catalog_topic(NS))
    assert not can("deployer", "WRITE", "TOPIC", queue) and not can("deployer", "READ", "TOPIC", queue)
    assert can("analytics", "WRITE", "TRANSACTIONAL_ID", names.analytics_transactional_id(NS))
    assert not can("analytics", "WRITE", "TRANSACTIONAL_ID", P + "someone-else")
    assert not can("analytics", "WRITE", "TOPIC", queue)


def test_app_is_sender_and_reader():
    def ops(role):
        return {(b.operation, b.resource_type, b.pattern, b.name) for b in bindings(role, "User:x", NS)}

    assert ops("app") == ops("sender") | ops("reader")


def test_rules_merge_operations_on_one_pattern():
    merged = [r for r in rules("app", NS) if r.name == names.endpoints_topic(NS)]
    assert len(merged) == 1 and set(merged[0].operations) == {"READ", "WRITE"}


def test_unknown_role_and_bad_principal():
    with pytest.raises(ValueError, match="unknown role 'nobody'"):
        bindings("nobody", "User:a", NS)
    for bad in ("alice", "User:", "User:*", ""):
        with pytest.raises(ValueError, match="Type:name"):
            check_principal(bad)
    with pytest.raises(ValueError, match="namespace"):
        bindings("app", "User:a", "bad.ns")


# --- the transport's split ---------------------------------------------------------------------


def test_the_installer_creates_only_the_endpoints_queues():
    acls = transport_split(NS, "Sales", "User:installer", "User:sales")
    q = lambda queue: transport_queue_topic(NS, queue)  # noqa: E731
    creates = [a for a in acls if a.operation == "CREATE"]
    assert creates and all(a.principal == "User:installer" and a.resource_type == "TOPIC" for a in creates)
    for topic in (q("Sales"), q("Sales.m1"), q("Sales.other-machine"), names.deadletter_topic(NS)):
        assert allowed(acls, "User:installer", "CREATE", "TOPIC", topic), topic
    # not another endpoint's queue, not one whose name merely starts with `Sales`, nothing else of the namespace
    for topic in (
        q("Billing"),
        q("Billing.m1"),
        q("SalesReport"),
        q("Sales2.m1"),
        names.queue_topic(NS, "Sales"),
        f"{names.prefix(NS)}catalog",
        "kbroker.other.tqueue.Sales",
    ):
        assert not allowed(acls, "User:installer", "CREATE", "TOPIC", topic), topic


def test_the_runner_never_gets_create():
    acls = transport_split(NS, "Sales", "User:installer", "User:sales")
    q = lambda queue: transport_queue_topic(NS, queue)  # noqa: E731
    runner = [a for a in acls if a.principal == "User:sales"]
    assert runner and not any(a.operation in ("CREATE", "ALTER", "DELETE", "ALTER_CONFIGS", "ALL") for a in runner)
    for kind in ("TOPIC", "GROUP"):  # it reads its own queues (a queue's group is named as its topic)
        assert allowed(acls, "User:sales", "READ", kind, q("Sales"))
        assert allowed(acls, "User:sales", "READ", kind, q("Sales.m1"))
        for other in (q("Billing"), q("SalesReport")):
            assert not allowed(acls, "User:sales", "READ", kind, other), other
    for topic in (q("Billing"), q("Billing.m2"), q("Sales"), names.deadletter_topic(NS)):
        assert allowed(acls, "User:sales", "WRITE", "TOPIC", topic), topic
    assert not allowed(acls, "User:sales", "WRITE", "TOPIC", "kbroker.other.tqueue.Billing")
    assert allowed(acls, "User:sales", "WRITE", "TRANSACTIONAL_ID", names.prefix(NS) + "committer-1")
    # an idempotent producer needs WRITE on a topic only (KIP-679), not IDEMPOTENT_WRITE on the cluster
    assert not any(a.resource_type == "CLUSTER" for a in acls)


def test_without_an_endpoint_the_transport_roles_cover_every_transport_queue():
    acls = bindings("transport-runner", "User:r", NS)
    assert allowed(acls, "User:r", "READ", "TOPIC", transport_queue_topic(NS, "Anything.m1"))
    assert not allowed(acls, "User:r", "READ", "TOPIC", names.queue_topic(NS, "Orders"))


def test_sends_to_lets_the_runner_write_only_the_named_queues_of_other_namespaces():
    acls = transport_split(NS, "Sales", "User:installer", "User:sales", sends_to=["Billing@finance", "error@ops"])
    plain = transport_split(NS, "Sales", "User:installer", "User:sales")
    extra = set(acls) - set(plain)
    assert set(plain) <= set(acls) and len(acls) == len(set(acls))
    assert {(a.principal, a.operation, a.resource_type) for a in extra} == {("User:sales", "WRITE", "TOPIC")}
    assert {(a.pattern, a.name) for a in extra} == {
        ("LITERAL", "kbroker.finance.tqueue.Billing"),
        ("PREFIXED", "kbroker.finance.tqueue.Billing."),
        ("LITERAL", "kbroker.ops.tqueue.error"),
        ("PREFIXED", "kbroker.ops.tqueue.error."),
    }
    fin = lambda queue: transport_queue_topic("finance", queue)  # noqa: E731
    # the queue, and its endpoint's machine queues (where replies to its instances come back); WRITE implies
    # the DESCRIBE of the send's queue look-up
    for topic in (fin("Billing"), fin("Billing.m1"), transport_queue_topic("ops", "error")):
        assert allowed(acls, "User:sales", "WRITE", "TOPIC", topic), topic
        assert allowed(acls, "User:sales", "DESCRIBE", "TOPIC", topic), topic
    for topic in (fin("BillingReport"), fin("Shipping"), transport_queue_topic("financex", "Billing")):
        assert not allowed(acls, "User:sales", "WRITE", "TOPIC", topic), topic
    for op, kind, name in (
        ("READ", "TOPIC", fin("Billing")),
        ("READ", "GROUP", fin("Billing")),
        ("WRITE", "TOPIC", names.deadletter_topic("finance")),
        ("WRITE", "TRANSACTIONAL_ID", names.prefix("finance") + "committer-1"),
    ):
        assert not allowed(acls, "User:sales", op, kind, name), (op, kind, name)
    # the send's (and the mover's) transactional ids stay the sender's: no cluster right, no new id
    assert {a.resource_type for a in extra} == {"TOPIC"} and not any(a.resource_type == "CLUSTER" for a in acls)
    assert allowed(plain, "User:sales", "WRITE", "TRANSACTIONAL_ID", delayed_topic(NS, "Sales") + ".a-mover-uuid")
    assert not any(a.principal == "User:installer" and "finance" in a.name for a in acls)


def test_sends_to_in_the_own_namespace_or_twice_adds_nothing():
    plain = set(transport_split(NS, "Sales", "User:i", "User:s"))
    assert set(transport_split(NS, "Sales", "User:i", "User:s", sends_to=["Billing", f"Billing@{NS}"])) == plain
    twice = transport_split(NS, "Sales", "User:i", "User:s", sends_to=["Billing@finance", "Billing@finance"])
    assert len(twice) == len(set(twice)) == len(plain) + 2
    wide = set(bindings("transport-runner", "User:s", NS, sends_to=["Billing@finance"]))  # every endpoint's runner
    assert wide - set(bindings("transport-runner", "User:s", NS)) == set(twice) - plain


@pytest.mark.parametrize("address", ["", "@finance", "Billing@", "Billing@bad ns", "Billing@a@b", "Bil ling@finance"])
def test_sends_to_refuses_a_bad_address_naming_it(address):
    with pytest.raises(ValueError, match="transport address") as refused:
        transport_split(NS, "Sales", "User:i", "User:s", sends_to=["Billing@finance", address])
    assert repr(address) in str(refused.value) and "\n" not in str(refused.value)


def test_the_installer_does_not_read_or_write():
    acls = transport_split(NS, "Sales", "User:installer", "User:sales")
    assert {a.operation for a in acls if a.principal == "User:installer"} <= {"CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"}


def test_acl_command_text():
    b = AclBinding("User:installer", "CREATE", "TOPIC", "PREFIXED", "kbroker.sales.tqueue.Sales")
    assert b.command("k:9092") == (
        "kafka-acls.sh --bootstrap-server k:9092 --add --allow-principal "
        "'User:installer' --operation CREATE --resource-pattern-type prefixed "
        "--topic 'kbroker.sales.tqueue.Sales'"
    )
    g = AclBinding("User:sales", "READ", "GROUP", "LITERAL", "grp")
    assert g.command("k:9092").endswith("--operation READ --resource-pattern-type literal --group 'grp'")
    t = AclBinding("User:sales", "WRITE", "TRANSACTIONAL_ID", "PREFIXED", "kbroker.sales.")
    assert t.command("k:9092").endswith("--resource-pattern-type prefixed --transactional-id 'kbroker.sales.'")
    c = AclBinding("User:sales", "IDEMPOTENT_WRITE", "CLUSTER", "LITERAL", "kafka-cluster")
    assert c.command("k:9092") == (
        "kafka-acls.sh --bootstrap-server k:9092 --add --allow-principal "
        "'User:sales' --operation IDEMPOTENT_WRITE --cluster"
    )


@pytest.mark.parametrize("role", list(ROLES))
def test_every_binding_has_a_command_and_converts_to_kafka_and_back(role):
    from kbroker.kafka.security.acls import from_kafka, to_kafka

    for a in bindings(role, "User:r", NS, routes_to=["billing"], sends_to=["Billing@finance"]):
        assert a.command("b:1").startswith("kafka-acls.sh --bootstrap-server b:1 --add")
        assert from_kafka(to_kafka(a)) == a


def test_the_cluster_resource_converts():
    from confluent_kafka.admin import ResourceType

    from kbroker.kafka.security.acls import from_kafka, to_kafka

    c = AclBinding("User:sales", "DESCRIBE", "CLUSTER", "LITERAL", "kafka-cluster")
    assert to_kafka(c).restype == ResourceType.BROKER and from_kafka(to_kafka(c)) == c


# --- the CLI, without a broker ---------------------------------------------------------------------


def test_acls_roles_prints_each_roles_rules_and_apply_dry_run_prints_the_plan():
    import json

    from click.testing import CliRunner

    from kbroker.cli import main

    out = CliRunner().invoke(main, ["acls", "roles", "--namespace", NS, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["role"] for r in rows} == set(ROLES) and all(r["why"] for r in rows)
    plan = CliRunner().invoke(
        main,
        [
            "acls",
            "apply",
            "--role",
            "app",
            "--principal",
            "User:orders",
            "--namespace",
            NS,
            "--dry-run",
            "--json",
            "--bootstrap",
            "127.0.0.1:1",
        ],
    )
    assert plan.exit_code == 0, plan.output
    assert {AclBinding(**b) for b in json.loads(plan.output)} == set(bindings("app", "User:orders", NS))
    bad = CliRunner().invoke(main, ["acls", "apply", "--role", "app", "--principal", "orders", "--dry-run"])
    assert bad.exit_code == 1 and bad.output.strip().endswith("must be Kafka's Type:name, e.g. User:alice")
    text = CliRunner().invoke(main, ["endpoint", "acls", "Sales", "--namespace", NS])
    assert text.exit_code == 0 and "IDEMPOTENT_WRITE" not in text.output
    assert all(line.startswith("kafka-acls.sh --bootstrap-server BOOTSTRAP --add") for line in text.output.splitlines())


def test_endpoint_acls_sends_to_prints_applies_and_refuses_a_bad_address():
    import json

    from click.testing import CliRunner

    from kbroker.cli import main

    args = ["endpoint", "acls", "Sales", "--namespace", NS, "--runner", "User:sales", "--sends-to", "Billing@finance"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert text.output.splitlines() == [
        b.command("BOOTSTRAP")
        for b in transport_split(NS, "Sales", "User:installer", "User:sales", sends_to=["Billing@finance"])
    ]
    assert (
        "kafka-acls.sh --bootstrap-server BOOTSTRAP --add --allow-principal 'User:sales' --operation WRITE "
        "--resource-pattern-type literal --topic 'kbroker.finance.tqueue.Billing'"
    ) in text.output.splitlines()
    data = CliRunner().invoke(main, [*args, "--sends-to", "Shipping@finance", "--json"])
    assert data.exit_code == 0, data.output
    assert [AclBinding(**b) for b in json.loads(data.output)] == transport_split(
        NS, "Sales", "User:installer", "User:sales", sends_to=["Billing@finance", "Shipping@finance"]
    )
    for bad in ("Billing@bad ns", "Billing@"):  # refused before anything is printed or applied
        out = CliRunner().invoke(main, [*args, "--sends-to", bad, "--apply", "--bootstrap", "127.0.0.1:1"])
        assert out.exit_code == 1 and out.output.count("\n") == 1, out.output
        assert out.output.startswith(f"kbroker: error: transport address {bad!r} is not queue or queue@namespace")


def test_the_control_topics_are_written_only_by_the_roles_that_write_them():
    """The catalog by its owner (the deployer), the analytics results and RECLASSIFY commands by
    the analytics job: no other role may write them."""
    writers = {"catalog": {"deployer"}, "analytics": {"analytics"}, "control": {"analytics"}}
    for system, roles in writers.items():
        topic = names.system_topic(NS, system)
        assert {r for r in ROLES if allowed(bindings(r, "User:x", NS), "User:x", "WRITE", "TOPIC", topic)} == roles
