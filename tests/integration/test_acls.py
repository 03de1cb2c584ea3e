"""Least privilege, proven on a secure embedded broker (SASL_SSL, StandardAuthorizer, no ACL: no
access). For each role of core/security/acl_roles.py a user of its own holds exactly the ACLs `kbroker
acls apply` gives the role, and runs the role's essential path: it works. Then, with one
essential ACL of those removed, the same path fails with a PermissionDeniedError naming the
principal, the operation and the resource, within a deadline, having written nothing, and
leaving no thread or process behind. And a transport runner's sends to another namespace: with
exactly what `kbroker endpoint acls --sends-to` grants, and refused without it.

The session's secure broker (conftest.secure_kafka); each test has a namespace and a user of its
own, with the sample catalog applied by the admin (the deployer's test applies it itself)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from kbroker.cli.demo import APPROVAL, CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.security import acl_roles
from kbroker.core.security.acl_bindings import AclBinding
from kbroker.core.transport.endpoint import install_plan, transport_queue_topic
from kbroker.embedded import resolve_cluster
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import PermissionDeniedError, TransportQueueNotFoundError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.security import acls
from kbroker.kafka.snapshot import read_to_end
from kbroker.kafka.transport.queues import install
from kbroker.sdk.broker import Broker
from kbroker.sdk.transport.endpoint import TransportEndpoint
from tests.helpers import ROOT, SAMPLES, free_port, run_kbroker_module, wait_for

DEADLINE = 30.0  # seconds within which a refusal must surface
QUEUE = "ExpenseQueue"


@pytest.fixture
def secure(secure_kafka: EmbeddedBroker) -> EmbeddedBroker:
    """The session's secure embedded broker (conftest)."""
    return secure_kafka


@pytest.fixture
def admin(secure_admin: Cluster) -> Cluster:
    """Its admin, a super user."""
    return secure_admin


@dataclass
class Run:
    """One role's run: the admin, the role's user and its namespace, and what the run started
    (closed by the test, whatever happens)."""

    secure: EmbeddedBroker
    admin: Cluster
    role: str
    ns: str
    tmp: Path
    request: pytest.FixtureRequest
    user: str = ""
    properties: Path = Path()
    options: dict[str, Any] = field(default_factory=dict)  # the role's RoleOptions (endpoint, routes_to)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def principal(self) -> str:
        return f"User:{self.user}"

    @property
    def cluster(self) -> Cluster:
        """The role's user, as kbroker's clients take it: the properties file `broker user add` wrote."""
        return resolve_cluster(self.secure.status().bootstrap, command_config=self.properties)

    def plan(self) -> list[AclBinding]:
        return acl_roles.bindings(self.role, self.principal, self.ns, **self.options)

    def later(self, fn: Callable[[], None]) -> None:
        self.cleanups.append(fn)


@pytest.fixture
def run(secure: EmbeddedBroker, admin: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Run]:
    role = request.node.callspec.params["role"]
    ns = "t" + uuid.uuid4().hex[:10]
    r = Run(secure, admin, role, ns, tmp_path, request, options={"endpoint": "Sales"} if "transport" in role else {})
    r.user = f"{role}-{uuid.uuid4().hex[:6]}"
    r.properties = secure.add_user(r.user)["scram"]
    if role != "deployer":
        apply_paths(admin, ns, [SAMPLES])
    before = {t.ident for t in threading.enumerate()}
    yield r
    for fn in reversed(r.cleanups):
        fn()
    acls.revoke_all(admin, r.principal, wait=False)
    # Nothing of the run left running: every thread it started has ended.
    wait_for(
        lambda: (
            not [
                t
                for t in threading.enumerate()
                if t.ident not in before and t.is_alive() and t.name.startswith("kbroker")
            ]
        ),
        15,
        "the run's threads to end",
    )


def records(cluster: Cluster, *topics: str) -> int:
    """Committed records in `topics` (a missing topic holds none)."""
    return sum(len(read_to_end(cluster, t, 10) or []) for t in topics)


# --- the roles' essential paths ---------------------------------------------------------------


def send_claim(cluster: Cluster, ns: str) -> None:
    with Broker(cluster, ns) as b:
        b.send(b.begin_dialog(EMP, EXP, CONTRACT), CLAIM, {"amount": 1})


def sender(r: Run) -> None:
    send_claim(r.cluster, r.ns)


def reader(r: Run) -> None:
    with Broker(r.cluster, r.ns) as b:
        with b.transaction() as tx:
            got = tx.receive(QUEUE, top=10, wait=20)
    assert len(got) == 1 and got[0].message_type_name == CLAIM


def app(r: Run) -> None:
    with Broker(r.cluster, r.ns) as b:
        with b.transaction() as tx:
            tx.send(tx.begin_dialog(EMP, EXP, CONTRACT), CLAIM, {"amount": 2})
        with b.transaction() as tx:
            got = tx.receive(QUEUE, top=10, wait=20)
            assert len(got) == 1
            tx.send(got[0].conversation_handle, APPROVAL, {"ok": True})


def worker(r: Run) -> None:
    """`kbroker worker` as the user: it ticks (TICK events), or exits with its one-line error."""
    log = r.tmp / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KBROKER_COMMAND_CONFIG": str(r.properties)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbroker",
                "worker",
                "--bootstrap",
                r.cluster.bootstrap,
                "--namespace",
                r.ns,
                "--web-port",
                str(free_port()),
                "--tick",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)

    r.later(stop)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = log.read_text().strip().splitlines()[-1]
            assert proc.returncode != 0 and last.startswith("kbroker: error: permission denied: "), log.read_text()
            raise PermissionDeniedError(last.removeprefix("kbroker: error: "))
        ticks = [
            e
            for e in map(orjson.loads, (m.value() for m in read_to_end(r.admin, names.events_topic(r.ns), 5) or []))
            if e.get("event") == "TICK"
        ]
        if len(ticks) >= 2:
            stop()
            assert proc.returncode is not None
            return
        time.sleep(0.5)
    raise AssertionError(f"the worker did not tick within 90 s: {log.read_text()[-3000:]}")


def analytics(r: Run) -> None:
    """The Spark job as the user, in the session's Spark: it counts the queue's records."""
    from kbroker.analytics.job import AnalyticsJob, JobSettings
    from kbroker.kafka.snapshot import latest_values

    spark = r.request.getfixturevalue("spark")
    settings = JobSettings(
        cluster=r.cluster, namespace=r.ns, checkpoint=r.tmp / "ckpt", history=r.tmp / "history", trigger=1.0, window=5.0
    )
    job = AnalyticsJob(settings, spark)
    r.later(job.stop)
    job.start()

    def counted() -> bool:
        failure = job.failure()
        if failure is not None:
            raise failure
        rows = latest_values(r.admin, names.analytics_topic(r.ns), 5) or {}
        return any(orjson.loads(v).get("arrivals") for k, v in rows.items() if k.startswith(f"queue/{QUEUE}/".encode()))

    wait_for(counted, 90, "the job's count of the queue")


def router(r: Run) -> None:
    """The user's transmitter and dispatcher of namespace A deliver a SEND to namespace B on this
    cluster (whose dispatcher the admin runs) and see it acknowledged."""
    from kbroker.kafka.routing.dispatcher import Dispatcher
    from kbroker.kafka.routing.transmitter import Transmitter
    from tests.integration.test_routing import CLIENT, REQUEST, SERVER
    from tests.integration.test_routing import CONTRACT as ROUTED

    b_ns = r.ns + "b"
    ba, bb = Broker(r.admin, r.ns), Broker(r.admin, b_ns)
    r.later(bb.close)
    r.later(ba.close)
    services = [Dispatcher(r.admin, b_ns, bb.refresh_catalog, tick=1.0).start()]
    r.later(services[0].close)
    transmitter = Transmitter(r.cluster, r.ns, lambda: ba.catalog, tick=1.0).start()
    r.later(transmitter.close)
    dispatcher = Dispatcher(r.cluster, r.ns, lambda: ba.catalog, tick=1.0).start()
    r.later(dispatcher.close)
    ba.send(ba.begin_dialog(CLIENT, SERVER, ROUTED), REQUEST, {"n": 1})

    def delivered() -> bool:
        for svc in (transmitter, dispatcher):
            if svc.denied is not None:
                raise svc.denied
        return bool(bb.receive("Q", top=10, wait=0.5))

    wait_for(delivered, 30, "the message delivered to namespace B")
    wait_for(lambda: transmitter.acked >= 1, 15, "its acknowledgement")


def transport_installer(r: Run) -> None:
    created = install(r.cluster, r.ns, install_plan("Sales", "m1"))
    assert transport_queue_topic(r.ns, "Sales") in created


def transport_runner(r: Run) -> None:
    with TransportEndpoint("Sales", cluster=r.cluster, namespace=r.ns, machine="m1") as ep:
        ep.send("Sales", b"hello")
        with ep.transaction() as tx:
            msg = tx.receive(wait=20)
            assert msg is not None and msg.body == b"hello"
            tx.send("Sales.m1", b"reply")
        ep.send("Sales", b"later", delay=0.2)  # into the endpoint's delayed store
        seen: list[bytes | None] = []
        ep.start(lambda msg, tx: seen.append(msg.body))  # its mover moves it: READ and WRITE on the store

        def moved() -> bool:
            if ep.mover is not None and ep.mover.denied is not None:
                raise ep.mover.denied
            return b"later" in seen

        wait_for(moved, 30, "the delayed message moved and handled")
        ep.subscribe("OrderPlaced")  # the subscription table: WRITE, then READ at the publish
        ep.publish("OrderPlaced", b"event")
        wait_for(lambda: b"event" in seen, 30, "the published event handled")


def deployer(r: Run) -> None:
    """`kbroker apply` as the user, twice (the second reads the catalog and the topics' configs):
    the CLI's one-line error when refused."""
    for _ in range(2):
        out = run_kbroker_module(
            "apply",
            str(SAMPLES),
            "--bootstrap",
            r.cluster.bootstrap,
            "--command-config",
            str(r.properties),
            "--namespace",
            r.ns,
            timeout=120,
        )
        if out.returncode != 0:
            lines = out.stderr.strip().splitlines()  # progress lines, then the error's one line
            errors = [line for line in lines if line.startswith("kbroker: error: ")]
            assert errors == lines[-1:] and errors[0].startswith("kbroker: error: permission denied: "), out.stderr
            raise PermissionDeniedError(errors[0].removeprefix("kbroker: error: "))


@dataclass(frozen=True)
class Case:
    """A role's test: its essential path; the ACL the refusal test takes away, (operation,
    resource type, name after kbroker.<ns>.); the topics that must not gain a record when
    refused (names after kbroker.<ns>., or kbroker.<ns>b. for `b:`: the router's other
    namespace); what the refusal names, (operation, resource kind, name after kbroker.<ns>. if
    any); and what the admin does first."""

    path: Callable[[Run], None]
    drop: tuple[str, str, str]
    untouched: tuple[str, ...]
    names: tuple[str, ...]
    setup: Callable[[Run], None] = lambda r: None


def _sent_as_admin(r: Run) -> None:
    send_claim(r.admin, r.ns)


def _installed_as_admin(r: Run) -> None:
    install(r.admin, r.ns, install_plan("Sales", "m1"))


def _routes(r: Run) -> None:
    from tests.integration.test_routing import setup_catalogs

    r.options["routes_to"] = [r.ns + "b"]
    setup_catalogs(r.admin, r.tmp, r.ns, r.ns + "b")


CASES: dict[str, Case] = {
    "sender": Case(
        sender, ("WRITE", "TOPIC", "queue."), ("queue.ExpenseQueue",), ("WRITE", "topic", "queue.ExpenseQueue")
    ),
    "reader": Case(
        reader,
        ("READ", "GROUP", "queue."),
        ("endpoints", "events", "deadletter"),
        ("READ", "group", "queue.ExpenseQueue"),
        setup=_sent_as_admin,
    ),
    "app": Case(
        app,
        ("WRITE", "TRANSACTIONAL_ID", ""),
        ("queue.ExpenseQueue", "queue.EmployeeQueue"),
        ("WRITE", "transactional id"),
    ),
    "worker": Case(worker, ("READ", "GROUP", ""), ("events", "ticks"), ("READ", "group", "worker")),
    "analytics": Case(
        analytics,
        ("WRITE", "TRANSACTIONAL_ID", "analytics-job"),
        ("analytics", "control"),
        ("WRITE", "transactional id", "analytics-job"),
        setup=_sent_as_admin,
    ),
    "router": Case(
        router,
        ("READ", "TOPIC", "transmission"),
        ("b:inbound", "b:queue.Q"),
        ("READ", "topic", "transmission"),
        setup=_routes,
    ),
    "transport-installer": Case(
        transport_installer, ("CREATE", "TOPIC", "tqueue.Sales"), (), ("CREATE", "topic", "tqueue.Sales")
    ),
    "transport-runner": Case(
        transport_runner,
        ("WRITE", "TOPIC", "tqueue."),
        ("tqueue.Sales", "tqueue.Sales.m1"),
        ("WRITE", "topic", "tqueue.Sales"),
        setup=_installed_as_admin,
    ),
    "deployer": Case(deployer, ("WRITE", "TOPIC", "catalog"), ("catalog",), ("WRITE", "topic", "catalog")),
}


def test_every_role_has_a_case() -> None:
    assert set(CASES) == set(acl_roles.ROLES)


@pytest.mark.parametrize("role", list(CASES))
def test_each_role_works_with_only_its_acls(run: Run, role: str) -> None:
    case = CASES[role]
    case.setup(run)
    if role == "deployer":  # through the CLI: `kbroker acls apply`, as the admin
        out = run_kbroker_module(
            "acls",
            "apply",
            "--role",
            role,
            "--principal",
            run.principal,
            "--namespace",
            run.ns,
            "--bootstrap",
            run.admin.bootstrap,
            "--command-config",
            str(run.secure.secure_files.admin_properties),
            "--json",
        )
        assert out.returncode == 0, out.stderr
        assert {AclBinding(**b) for b in json.loads(out.stdout)} == set(run.plan())
    else:
        acls.grant(run.admin, run.plan())
    assert set(acls.listed(run.admin, run.principal)) == set(run.plan())
    case.path(run)


@pytest.mark.parametrize("role", list(CASES))
def test_each_role_without_one_essential_acl_is_refused_fast_and_writes_nothing(run: Run, role: str) -> None:
    case = CASES[role]
    case.setup(run)
    op, kind, suffix = case.drop
    plan = run.plan()
    dropped = [b for b in plan if (b.operation, b.resource_type, b.name) == (op, kind, names.prefix(run.ns) + suffix)]
    assert len(dropped) == 1, (case.drop, plan)
    acls.grant(run.admin, [b for b in plan if b not in dropped])
    untouched = [
        names.prefix(run.ns + "b") + t[2:] if t.startswith("b:") else names.prefix(run.ns) + t for t in case.untouched
    ]
    before = records(run.admin, *untouched)
    started = time.monotonic()
    with pytest.raises(PermissionDeniedError) as refused:
        case.path(run)
    took = time.monotonic() - started
    for cleanup in reversed(run.cleanups):
        cleanup()
    run.cleanups.clear()
    assert took < DEADLINE, f"refused only after {took:.1f} s"
    line = str(refused.value)
    assert refused.value.retriable is False and "\n" not in line
    operation, resource, *name = case.names
    assert line.startswith(f"permission denied: {run.principal} may not {operation} {resource}"), line
    assert all(names.prefix(run.ns) + n in line for n in name), line
    assert records(run.admin, *untouched) == before, "a refused run wrote"
    if role == "transport-installer":  # its topics were not created either
        from kbroker.kafka import clients

        assert transport_queue_topic(run.ns, "Sales") not in clients.admin(run.admin).list_topics(timeout=10).topics


@pytest.mark.parametrize("role", ["router"])
def test_a_dispatcher_refused_writing_its_queue_stops_with_the_refusal_and_the_sender_keeps_the_message(
    run: Run, role: str
) -> None:
    """Namespace B's router lacks WRITE on B's queues: its dispatcher stops with the refusal
    (naming the principal and the queue topic), saves and acknowledges nothing, and A's
    transmitter keeps the message, unacknowledged, for when the grant comes."""
    from kbroker.kafka.routing.dispatcher import Dispatcher
    from kbroker.kafka.routing.transmitter import Transmitter
    from tests.integration.test_routing import CLIENT, REQUEST, SERVER
    from tests.integration.test_routing import CONTRACT as ROUTED

    _routes(run)
    b = run.ns + "b"
    plan = acl_roles.bindings("router", run.principal, b)
    acls.grant(run.admin, [x for x in plan if (x.operation, x.name) != ("WRITE", names.prefix(b) + "queue.")])
    ba, bb = Broker(run.admin, run.ns), Broker(run.admin, b)
    run.later(bb.close)
    run.later(ba.close)
    transmitter = Transmitter(run.admin, run.ns, lambda: ba.catalog, tick=1.0).start()
    run.later(transmitter.close)
    dispatcher = Dispatcher(run.cluster, b, bb.refresh_catalog, tick=1.0).start()
    run.later(dispatcher.close)
    ba.send(ba.begin_dialog(CLIENT, SERVER, ROUTED), REQUEST, {"n": 1})
    denied = wait_for(lambda: dispatcher.denied, DEADLINE, "the dispatcher to stop with the refusal")
    line = str(denied)
    assert isinstance(denied, PermissionDeniedError) and "\n" not in line
    assert line.startswith(f"permission denied: {run.principal} may not WRITE topic"), line
    assert names.queue_topic(b, "Q") in line, line
    assert records(run.admin, names.queue_topic(b, "Q"), names.acks_topic(b)) == 0
    assert len(transmitter.queue) == 1 and transmitter.acked == 0


def _endpoint_acls_applied(
    r: Run, endpoint: str, ns: str, installer: str, runner: str, sends_to: str
) -> set[AclBinding]:
    """`kbroker endpoint acls ENDPOINT --sends-to ADDRESS --apply --json` as the admin: the runner's
    ACLs it printed, checked to be exactly what the cluster now lists for the runner."""
    out = run_kbroker_module(
        "endpoint",
        "acls",
        endpoint,
        "--namespace",
        ns,
        "--installer",
        installer,
        "--runner",
        runner,
        "--sends-to",
        sends_to,
        "--apply",
        "--json",
        "--bootstrap",
        r.admin.bootstrap,
        "--command-config",
        str(r.secure.secure_files.admin_properties),
    )
    assert out.returncode == 0, out.stderr
    printed = {AclBinding(**b) for b in json.loads(out.stdout) if b["principal"] == runner}
    assert set(acls.listed(r.admin, runner)) == printed
    return printed


@pytest.mark.parametrize("role", ["transport-runner"])
def test_sends_to_grants_a_runner_the_queue_of_another_namespace_and_without_it_the_send_is_refused(
    run: Run, role: str
) -> None:
    """Sales (namespace A) and Billing (namespace B) each run as a principal holding exactly what
    `kbroker endpoint acls ... --sends-to` printed for it (Sales: `Billing@B`, Billing: `Sales@A`):
    a request and its reply to Sales's machine queue, and a delayed send that Sales's own mover
    moves to B, all arrive. The same runner with the plain split (no --sends-to) is refused the
    send and the delayed send to B, within the deadline, having written nothing there."""
    far = run.ns + "b"
    install(run.admin, run.ns, install_plan("Sales", "m1"))
    install(run.admin, far, install_plan("Billing", "m1"))
    installer = f"User:installer-{uuid.uuid4().hex[:6]}"
    billing_user = f"billing-{uuid.uuid4().hex[:6]}"
    billing_cluster = resolve_cluster(
        run.secure.status().bootstrap, command_config=run.secure.add_user(billing_user)["scram"]
    )
    for principal in (installer, f"User:{billing_user}"):
        run.later(lambda p=principal: acls.revoke_all(run.admin, p, wait=False))
    sales_acls = _endpoint_acls_applied(run, "Sales", run.ns, installer, run.principal, f"Billing@{far}")
    plain = set(acl_roles.bindings("transport-runner", run.principal, run.ns, endpoint="Sales"))
    assert {(b.operation, b.pattern, b.name) for b in sales_acls - plain} == {
        ("WRITE", "LITERAL", transport_queue_topic(far, "Billing")),
        ("WRITE", "PREFIXED", transport_queue_topic(far, "Billing") + "."),
    }
    _endpoint_acls_applied(run, "Billing", far, installer, f"User:{billing_user}", f"Sales@{run.ns}")

    got: list[bytes | None] = []

    def bill(msg: Any, tx: Any) -> None:
        got.append(msg.body)
        tx.reply(msg, b"billed " + (msg.body or b""))  # to Sales.m1@A: Billing's runner writes A's queue

    with (
        TransportEndpoint("Billing", cluster=billing_cluster, namespace=far, machine="m1") as billing,
        TransportEndpoint("Sales", cluster=run.cluster, namespace=run.ns, machine="m1") as sales,
    ):
        billing.start(bill)
        sales.start(lambda msg, tx: None)  # its secondary queue's reader (the callback) and its mover
        reply = sales.request(f"Billing@{far}", b"order 1").result(30)
        assert reply.body == b"billed order 1" and reply.queue == "Sales.m1"
        sales.send(f"Billing@{far}", b"later", delay=0.5)  # stored in Sales's store, moved by Sales's mover

        def moved() -> bool:
            for ep in (sales, billing):
                if ep.mover is not None and ep.mover.denied is not None:
                    raise ep.mover.denied
            return b"later" in got

        wait_for(moved, 30, "the delayed send moved to the other namespace and handled")
    assert got == [b"order 1", b"later"]

    # The plain split, without --sends-to: the same runner is refused the send to B.
    acls.revoke(run.admin, sales_acls - plain)
    assert set(acls.listed(run.admin, run.principal)) == plain
    before = records(run.admin, transport_queue_topic(far, "Billing"))
    with TransportEndpoint("Sales", cluster=run.cluster, namespace=run.ns, machine="m1") as sales:
        for delayed in ({}, {"delay": 0.5}):
            started = time.monotonic()
            # Refused at the send's queue look-up, before anything is written: the authorizer leaves a
            # topic the principal may not DESCRIBE out of the cluster's topic list, so the look-up
            # (kafka/transport/queues.py) cannot tell it from a queue nobody installed.
            with pytest.raises(TransportQueueNotFoundError, match=transport_queue_topic(far, "Billing")):
                sales.send(f"Billing@{far}", b"refused", **delayed)
            assert time.monotonic() - started < DEADLINE
    assert records(run.admin, transport_queue_topic(far, "Billing")) == before
