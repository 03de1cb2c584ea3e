"""Service Broker's permissions on the session's secure embedded broker (SASL_SSL, an authorizer
that denies what no ACL allows): each grant's absence refused and its presence served (SEND,
RECEIVE, ALTER, the catalog's owner), DENY winning over a grant, REVOKE taking it away,
`kbroker permissions` listing what the cluster's ACLs hold; two namespaces whose principals
cannot touch each other's; and apply refusing names that would collide in Kafka."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.security.permissions import Objects, Permission, bindings_of
from kbroker.embedded import resolve_cluster
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import (
    CatalogError,
    PermissionDeniedError,
    QueueDisabledError,
    SendPermissionDeniedError,
    TopicCollisionError,
)
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog, write_records
from kbroker.kafka.queue_views import set_queue_status
from kbroker.kafka.security import acls
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, run_kbroker_module, wait_for

QUEUE = "ExpenseQueue"
SETTLE = 30.0  # seconds for the authorizer to apply an ACL change it has listed


def fresh(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


class User:
    """A SCRAM user of the secure broker and the cluster as kbroker's clients take it."""

    def __init__(self, secure: EmbeddedBroker, admin: Cluster, name: str):
        self.name, self.principal, self.admin = name, f"User:{name}", admin
        self.properties = str(secure.add_user(name)["scram"])
        self.cluster = resolve_cluster(secure.status().bootstrap, command_config=self.properties)
        self.admin_properties = str(secure.secure_files.admin_properties)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        """A `kbroker` command as this user."""
        return run_kbroker_module(*args, "--bootstrap", self.admin.bootstrap, "--command-config", self.properties)

    def cli(self, *args: str, as_json: bool = True) -> str:
        """A `kbroker` command as the admin; its (--json) output."""
        out = run_kbroker_module(
            *args,
            "--bootstrap",
            self.admin.bootstrap,
            "--command-config",
            self.admin_properties,
            *(["--json"] if as_json else []),
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def permissions(self, ns: str) -> set[str]:
        listed = json.loads(self.cli("permissions", "--principal", self.principal, "--namespace", ns))
        return {f"{p['state']} {p['permission']} ON {p['class']}::{p['name']}" for p in listed["permissions"]}


@pytest.fixture
def user(secure_kafka: EmbeddedBroker, secure_admin: Cluster):
    made: list[User] = []

    def make() -> User:
        made.append(User(secure_kafka, secure_admin, fresh("p-")))
        return made[-1]

    yield make
    for u in made:
        acls.revoke_all(secure_admin, u.principal, wait=False)


def records(cluster: Cluster, *topics: str) -> int:
    return sum(len(read_to_end(cluster, t, 10) or []) for t in topics)


def eventually(fn: Callable[[], object], what: str, refused: type[Exception] | None = None) -> object:
    """fn()'s result once the authorizer applies the change just listed: until it stops raising
    PermissionDeniedError, or (`refused`) until it raises that error, which is returned."""

    def attempt() -> object:
        try:
            result = fn()
        except PermissionDeniedError as exc:
            return exc if refused is not None and isinstance(exc, refused) else None
        return None if refused is not None else (result if result is not None else True)

    return wait_for(attempt, SETTLE, what)


def send_claim(cluster: Cluster, ns: str) -> str:
    with Broker(cluster, ns) as b:
        return b.send(b.begin_dialog(EMP, EXP, CONTRACT), CLAIM, {"amount": 1})


def test_send_needs_send_on_the_service_deny_wins_and_revoke_takes_it_away(user, secure_admin):
    ns = fresh("g")
    apply_paths(secure_admin, ns, [SAMPLES])
    u = user()
    watched = (names.queue_topic(ns, QUEUE), names.endpoints_topic(ns), names.timers_topic(ns))
    # SEND on the other service: everything a sender needs but the target's queue.
    u.cli("grant", "SEND", "ON", f"SERVICE::{EMP}", "TO", u.principal, "--namespace", ns)

    def refused_and_wrote_nothing(what: str) -> None:
        before = records(secure_admin, *watched)
        exc = eventually(lambda: send_claim(u.cluster, ns), what, refused=SendPermissionDeniedError)
        assert isinstance(exc, SendPermissionDeniedError) and exc.number == -8494 and exc.service == EXP
        assert f"{u.principal} may not WRITE topic {names.queue_topic(ns, QUEUE)}" in str(exc)
        assert records(secure_admin, *watched) == before, "a refused SEND wrote"

    refused_and_wrote_nothing("BEGIN DIALOG refused without SEND")
    with Broker(u.cluster, ns) as b, pytest.raises(SendPermissionDeniedError):  # in a transaction too
        with b.transaction() as tx:
            tx.begin_dialog(EMP, EXP, CONTRACT)
    assert u.permissions(ns) == {f"GRANT SEND ON SERVICE::{EMP}"}

    u.cli("grant", "SEND", "ON", f"SERVICE::{EXP}", "TO", u.principal, "--namespace", ns)
    eventually(lambda: send_claim(u.cluster, ns), "SEND served once granted")
    assert u.permissions(ns) == {f"GRANT SEND ON SERVICE::{EMP}", f"GRANT SEND ON SERVICE::{EXP}"}
    with Broker(u.cluster, ns) as b:  # a dialog begun while granted
        handle = b.begin_dialog(EMP, EXP, CONTRACT)

    u.cli("deny", "SEND", "ON", f"SERVICE::{EXP}", "TO", u.principal, "--namespace", ns)
    refused_and_wrote_nothing("the DENY winning over the grant")
    before = records(secure_admin, *watched)
    for in_transaction in (False, True):  # SEND on the dialog: refused before its lease is taken
        with Broker(u.cluster, ns) as b, pytest.raises(SendPermissionDeniedError):
            if in_transaction:
                with b.transaction() as tx:
                    tx.send(handle, CLAIM, {"amount": 2})
            else:
                b.send(handle, CLAIM, {"amount": 2})
    assert records(secure_admin, *watched) == before
    assert f"DENY SEND ON SERVICE::{EXP}" in u.permissions(ns)

    out = json.loads(u.cli("revoke", "SEND", "ON", f"SERVICE::{EXP}", "FROM", u.principal, "--namespace", ns))
    assert {a["permission"] for a in out["acls"]} == {"ALLOW", "DENY"}
    refused_and_wrote_nothing("REVOKE taking the grant away")
    assert u.permissions(ns) == {f"GRANT SEND ON SERVICE::{EMP}"}


def test_receive_alter_and_the_catalog_owner_each_need_their_grant(user, secure_admin, tmp_path):
    ns = fresh("r")
    apply_paths(secure_admin, ns, [SAMPLES])
    send_claim(secure_admin, ns)
    u = user()
    u.cli("grant", "SEND", "ON", f"SERVICE::{EMP}", "TO", u.principal, "--namespace", ns)  # a sender only

    def receive() -> int:
        with Broker(u.cluster, ns) as b, b.transaction() as tx:
            return len(tx.receive(QUEUE, top=10, wait=10))

    with pytest.raises(PermissionDeniedError):
        receive()
    # A reader of another queue (so holding the readers' base ACLs) refused RECEIVE on this one
    # writes nothing: no reader report, no tombstone of one.
    u.cli("grant", "RECEIVE", "ON", "QUEUE::EmployeeQueue", "TO", u.principal, "--namespace", ns)
    with pytest.raises(PermissionDeniedError):
        receive()
    assert not (read_to_end(secure_admin, names.readers_topic(ns)) or [])
    # The CLI says a refusal once: no log line repeating the error.
    refused = u.run("receive", QUEUE, "--wait", "3", "--namespace", ns)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"kbroker: error: permission denied: {u.principal} may not READ group {names.queue_group(ns, QUEUE)} "
        f"(reading queue {QUEUE})"
    ], refused.stderr
    # RECEIVE's grant holds what the queue's view needs; a queue not granted is named as refused.
    shown = wait_for(
        lambda: (lambda out: out if out.returncode == 0 else None)(
            u.run("queue", "show", "EmployeeQueue", "--namespace", ns)
        ),
        SETTLE,
        "queue show served to a RECEIVE grantee",
    )
    assert "queue EmployeeQueue: status ON" in shown.stdout, shown.stdout
    hidden = u.run("queue", "show", QUEUE, "--namespace", ns)
    assert hidden.returncode == 1 and hidden.stderr.strip().splitlines() == [
        f"kbroker: error: permission denied: {u.principal} may not DESCRIBE topic {names.queue_topic(ns, QUEUE)} "
        f"(cannot see topic {names.queue_topic(ns, QUEUE)})"
    ], hidden.stderr
    with pytest.raises(PermissionDeniedError):  # ALTER QUEUE ... STATUS = OFF
        set_queue_status(u.cluster, ns, QUEUE, "OFF", "test")
    with pytest.raises(PermissionDeniedError):  # a sender never writes the catalog, even directly
        write_records(u.cluster, names.catalog_topic(ns), {"queue/ExpenseQueue": b"{}"}, 10)
    with pytest.raises(PermissionDeniedError):
        apply_paths(u.cluster, ns, [SAMPLES], timeout=10)

    u.cli("grant", "RECEIVE,", "ALTER", "ON", f"QUEUE::{QUEUE}", "TO", u.principal, "--namespace", ns)
    assert eventually(receive, "RECEIVE served once granted") == 1
    eventually(lambda: set_queue_status(u.cluster, ns, QUEUE, "OFF", "test"), "ALTER QUEUE served once granted")
    assert read_catalog(secure_admin, ns).queue(QUEUE).status == "OFF"
    with pytest.raises(PermissionDeniedError):  # ALTER is not the catalog's owner
        apply_paths(u.cluster, ns, [SAMPLES], timeout=10)

    dry = u.cli(
        "grant", "CONTROL", "ON", "CATALOG::current", "TO", u.principal, "--namespace", ns, "--dry-run", as_json=False
    )
    assert dry.startswith(f"would have granted CONTROL ON CATALOG::{ns} to {u.principal}: "), dry
    with pytest.raises(PermissionDeniedError):  # the dry run changed nothing
        apply_paths(u.cluster, ns, [SAMPLES], timeout=10)
    u.cli("grant", "CONTROL", "ON", f"CATALOG::{ns}", "TO", u.principal, "--namespace", ns)
    eventually(lambda: apply_paths(u.cluster, ns, [SAMPLES], timeout=10), "apply served to the owner")
    assert u.permissions(ns) == {
        f"GRANT SEND ON SERVICE::{EMP}",
        f"GRANT RECEIVE ON QUEUE::{QUEUE}",
        "GRANT RECEIVE ON QUEUE::EmployeeQueue",
        f"GRANT ALTER ON QUEUE::{QUEUE}",
        f"GRANT CONTROL ON CATALOG::{ns}",
    }
    table = u.cli("permissions", "--principal", u.principal, "--namespace", ns, as_json=False)
    assert "RECEIVE" in table and f"CATALOG::{ns}" in table


def test_a_namespace_principal_is_refused_everything_in_another_namespace(user, secure_admin):
    a, b = fresh("na"), fresh("nb")
    owners = {}
    for ns in (a, b):
        apply_paths(secure_admin, ns, [SAMPLES])
        u = owners[ns] = user()
        objects = Objects.of(read_catalog(secure_admin, ns))
        acls.grant(
            secure_admin,
            bindings_of(
                [
                    Permission(u.principal, "CONTROL", "CATALOG", ns),
                    Permission(u.principal, "SEND", "SERVICE", EXP),
                    Permission(u.principal, "CONTROL", "QUEUE", QUEUE),
                ],
                objects,
            ),
        )
    for own, other in ((a, b), (b, a)):
        u = owners[own]
        # Served in its own namespace: apply, SEND, RECEIVE, ALTER QUEUE.
        eventually(lambda: apply_paths(u.cluster, own, [SAMPLES], timeout=10), "apply in its own namespace")  # noqa: B023
        send_claim(u.cluster, own)
        with Broker(u.cluster, own) as br:
            assert len(br.receive(QUEUE, top=10, wait=10)) == 1
        set_queue_status(u.cluster, own, QUEUE, "OFF", "test")
        # Refused in the other's, having written nothing there.
        before = records(
            secure_admin, names.queue_topic(other, QUEUE), names.catalog_topic(other), names.endpoints_topic(other)
        )
        status = read_catalog(secure_admin, other).queue(QUEUE).status
        for attempt in (  # each called now, below
            lambda: send_claim(u.cluster, other),  # noqa: B023
            lambda: Broker(u.cluster, other).receive(QUEUE, top=1, wait=5),  # noqa: B023
            lambda: set_queue_status(u.cluster, other, QUEUE, "OFF", "test"),  # noqa: B023
            lambda: apply_paths(u.cluster, other, [SAMPLES], timeout=10),  # noqa: B023
        ):
            with pytest.raises(PermissionDeniedError):
                attempt()
        with pytest.raises((PermissionDeniedError, CatalogError)):  # a raw write: the topic is hidden from it
            write_records(u.cluster, names.queue_topic(other, QUEUE), {"k": b"v"}, 10)
        assert (
            records(
                secure_admin, names.queue_topic(other, QUEUE), names.catalog_topic(other), names.endpoints_topic(other)
            )
            == before
        )
        assert read_catalog(secure_admin, other).queue(QUEUE).status == status


def test_apply_refuses_names_that_collide_in_kafka_with_another_namespace(user, secure_admin, tmp_path: Path):
    ns = fresh("c")
    with pytest.raises(TopicCollisionError, match=f"kbroker.{ns}.queue."):  # its topics would be ns's queues
        apply_paths(secure_admin, ns + "_queue", [SAMPLES])
    # A topic of another namespace, hidden from ns's owner, that one of ns's queues would collide with
    # (made directly, as apply would no longer make it): refused naming both, nothing created.
    from confluent_kafka.admin import NewTopic

    from kbroker.kafka import clients

    hidden = f"kbroker.{ns}_queue.Claims"
    admin = clients.admin(secure_admin)
    admin.create_topics([NewTopic(hidden, 1, 1)])[hidden].result(10)
    u = user()
    apply_paths(secure_admin, ns, [SAMPLES])
    acls.grant(
        secure_admin,
        bindings_of([Permission(u.principal, "CONTROL", "CATALOG", ns)], Objects.of(read_catalog(secure_admin, ns))),
    )
    (tmp_path / "q.yaml").write_text("queues:\n  - name: Claims\n")
    with pytest.raises(TopicCollisionError) as refused:
        eventually(
            lambda: apply_paths(u.cluster, ns, [tmp_path / "q.yaml"], timeout=10), "the owner's apply", refused=None
        )
    assert names.queue_topic(ns, "Claims") in str(refused.value) and hidden in str(refused.value)
    assert "Claims" not in read_catalog(secure_admin, ns).queues


def test_a_reader_that_may_not_write_the_catalog_disables_a_poisoned_queue_by_an_event(user, secure_admin):
    """Only the catalog's owner and ALTER's holders write the catalog: five rolled-back RECEIVEs
    of a principal with RECEIVE alone disable the queue, the catalog unchanged, for its process
    and every other reader (the verdict is an event on the events topic), until `queue enable`."""
    ns = fresh("p")
    apply_paths(secure_admin, ns, [SAMPLES])
    send_claim(secure_admin, ns)
    u = user()
    u.cli("grant", "RECEIVE", "ON", f"QUEUE::{QUEUE}", "TO", u.principal, "--namespace", ns)
    with Broker(u.cluster, ns) as b:
        for i in range(5):
            tx = b.transaction()
            got = (
                eventually(lambda: tx.receive(QUEUE, top=1, wait=10), "RECEIVE served")  # noqa: B023 - called now
                if i == 0
                else tx.receive(QUEUE, top=1, wait=10)
            )
            assert got, f"rollback {i}: the message came back"
            tx.rollback()
        with pytest.raises(QueueDisabledError):
            b.receive(QUEUE, wait=0)
        with Broker(u.cluster, ns) as other:  # another reading process, started after the verdict
            with pytest.raises(QueueDisabledError):
                other.receive(QUEUE, wait=0)
        assert read_catalog(secure_admin, ns).queue(QUEUE).status == "ON"
        set_queue_status(secure_admin, ns, QUEUE, "ON", "the poison message dealt with")

        def served() -> object:
            try:
                return b.receive(QUEUE, wait=1) or None
            except QueueDisabledError:
                return None

        assert wait_for(served, SETTLE, "RECEIVE served again after queue enable")


def test_diagnose_configuration_names_the_grants_a_dialog_needs_of_its_principal(user, secure_admin):
    """ssbdiagnose's permission checks: the principal that begins the dialog needs SEND on the
    target service and RECEIVE on the initiator's queue; each missing grant is named with the
    statement that gives it, and gone once granted."""
    from kbroker.kafka.diagnosis import diagnose_configuration

    ns = fresh("d")
    apply_paths(secure_admin, ns, [SAMPLES])
    u = user()
    u.cli("grant", "SEND", "ON", f"SERVICE::{EMP}", "TO", u.principal, "--namespace", ns)  # reads the catalog

    def named() -> dict[str, str]:
        problems, _ = diagnose_configuration(u.cluster, ns, EMP, EXP, CONTRACT)
        return {p.code: p.text for p in problems if p.code.endswith("_permitted")}

    missing = wait_for(
        lambda: len(named()) == 2 and named(),
        SETTLE,
        "both grants named",
        seen=lambda: diagnose_configuration(u.cluster, ns, EMP, EXP, CONTRACT),
    )
    assert missing["send_not_permitted"].endswith(f"GRANT SEND ON SERVICE::{EXP} TO {u.principal}"), missing
    assert missing["receive_not_permitted"].endswith(f"GRANT RECEIVE ON QUEUE::EmployeeQueue TO {u.principal}")
    u.cli("grant", "SEND", "ON", f"SERVICE::{EXP}", "TO", u.principal, "--namespace", ns)
    u.cli("grant", "RECEIVE", "ON", "QUEUE::EmployeeQueue", "TO", u.principal, "--namespace", ns)
    wait_for(lambda: named() == {}, SETTLE, "no grant named once both are given")
    problems, _ = diagnose_configuration(secure_admin, ns, EMP, EXP, CONTRACT)  # the admin may do all
    assert not [p for p in problems if p.code.endswith("_permitted")], problems
