"""The essential flows on a secured Kafka (the session's secure embedded broker: SASL_SSL with
SCRAM-SHA-512 and PLAIN, mutual TLS, an authorizer that denies what no ACL allows), each reached
the way a user reaches theirs: a Kafka client properties file with Java names, translated by
kbroker for librdkafka, the worker's aiokafka, Spark and its own wire client. SEND and RECEIVE in a
transaction (SCRAM, PLAIN, a client certificate), the worker's activation and tick, the analytics
job's counts, a dialog routed between a plaintext cluster and the secured one, a transport
endpoint; and nothing reaches the secured broker without credentials."""

from __future__ import annotations

import uuid

import orjson
import pytest

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core.cluster import Cluster
from kbroker.core.security.acl_roles import bindings
from kbroker.core.security.client_properties import Jaas, parse_jaas, read_properties
from kbroker.embedded import resolve_cluster
from kbroker.errors import AuthenticationFailedError, BrokerUnavailableError, PermissionDeniedError
from kbroker.kafka import clients, wire
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.queue_views import queue_view
from kbroker.kafka.security import acls
from kbroker.sdk.broker import Broker, connect
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.worker.web.views import monitor_rows
from tests.helpers import DATA, SAMPLES, wait_for
from tests.integration.test_routing import CLIENT, REPLY, REQUEST, SERVER, two_namespaces
from tests.integration.test_routing import CONTRACT as ROUTED
from tests.integration.test_worker import Worker, collect_done, send_jobs


def fresh(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


def claims_round_trip(b: Broker, n: int = 5) -> list[int]:
    """n claims SENT in one transaction and RECEIVEd in another; the claims received, in order."""
    with b.transaction() as tx:
        h = tx.begin_dialog(EMP, EXP, CONTRACT)
        for i in range(n):
            tx.send(h, CLAIM, {"claim": i})
    got: list[int] = []
    for _ in range(10):
        with b.transaction() as tx:
            got += [orjson.loads(m.body)["claim"] for m in tx.receive("ExpenseQueue", top=n, wait=5)]
        if len(got) >= n:
            break
    return got


def test_send_and_receive_in_a_transaction_as_the_admin_with_scram_from_the_properties_file(secure_kafka, secure_admin):
    ns = fresh("s")
    apply_paths(secure_admin, ns, [SAMPLES])
    status = secure_kafka.status()
    assert "sasl.jaas.config" in status.client_properties.read_text()  # Java names, as Kafka's tools read
    with connect(status.bootstrap, ns, command_config=status.client_properties) as b:
        assert claims_round_trip(b) == [0, 1, 2, 3, 4]
    # The CLI reads the same file (--command-config), wire client included (the on-disk bytes).
    view = queue_view(secure_admin, ns, "ExpenseQueue", 10)
    assert view["partitions"] >= 1 and all(p["bytes"] is not None for p in view["partition_offsets"])


def grant_namespace(admin: Cluster, principal: str, ns: str) -> None:
    """The `app` role's ACLs (SEND and RECEIVE in transactions) on namespace `ns`, for `principal`
    (each role with one ACL less is tests/integration/test_acls.py's)."""
    acls.grant(admin, bindings("app", principal, ns))


@pytest.mark.parametrize("login", ["scram", "mtls", "plain"])
def test_a_user_of_its_own_namespace_sends_and_receives_with_scram_a_client_certificate_or_plain(
    secure_kafka, secure_admin, login, tmp_path
):
    ns = fresh("u")
    apply_paths(secure_admin, ns, [SAMPLES])
    if login == "plain":  # PLAIN users are the broker's configuration, read at its start: the admin's
        props = tmp_path / "admin-plain.properties"
        admin = read_properties(secure_kafka.status().client_properties.read_text())
        login_options = parse_jaas(admin["sasl.jaas.config"]).options
        admin.update(
            {
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": Jaas(
                    "org.apache.kafka.common.security.plain.PlainLoginModule", "required", login_options
                ).line(),
            }
        )
        props.write_text("".join(f"{k}={v}\n" for k, v in admin.items()))
    else:
        user = "app-" + uuid.uuid4().hex[:6]
        props = secure_kafka.add_user(user)[login]
        grant_namespace(secure_admin, f"User:{user}", ns)
    cluster = resolve_cluster(None, command_config=props)  # the file's own bootstrap.servers
    with Broker(cluster, ns) as b:
        got = wait_for(lambda: _round_trip_or_none(b), 60, "the ACLs applied by the authorizer")
        assert got == [0, 1, 2]


def _round_trip_or_none(b: Broker) -> list[int] | None:
    try:
        return claims_round_trip(b, 3)
    except PermissionDeniedError:  # the authorizer applies new ACLs from its metadata log, soon
        return None


def test_no_credentials_or_a_wrong_password_gets_nothing(secure_kafka, secure_admin):
    status = secure_kafka.status()
    with pytest.raises(BrokerUnavailableError):  # plaintext into a TLS listener: never an answer
        clients.brokers_answering(status.bootstrap, timeout=3)
    wrong = Cluster.with_properties(
        status.bootstrap,
        {
            **secure_admin.properties,
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="admin" password="not-it";',
        },
    )
    with pytest.raises(AuthenticationFailedError):
        clients.brokers_answering(wrong, timeout=10)
    with pytest.raises(AuthenticationFailedError):
        wire.connect(wrong, None, 10)
    wire.connect(secure_admin, None, 10).close()  # TLS, then SCRAM on kbroker's own client


def test_the_worker_activates_readers_and_ticks_on_the_secured_cluster(secure_kafka, secure_admin, tmp_path):
    ns = fresh("w")
    apply_paths(secure_admin, ns, [DATA / "worker.yaml"])
    status = secure_kafka.status()
    w = Worker(status.bootstrap, ns, tmp_path, KBROKER_COMMAND_CONFIG=str(status.client_properties))
    try:
        w.wait_ready()
        with Broker(secure_admin, ns) as client:
            sent = send_jobs(client, "//kbroker/test/Slow", conversations=6, per_conversation=2)
            done = collect_done(client, len(sent), timeout=90)
        assert sorted(orjson.loads(m.body)["job"] for m in done) == sorted(sent)
        # The row's backlog is the queue watch's last count, which may predate the last commit.
        last: dict = {}

        def emptied() -> bool:
            rows = [r for r in monitor_rows(secure_admin, ns) if r["queue"] == "SlowQueue"]
            last["row"] = rows[0] if rows else None
            return bool(rows) and bool(rows[0]["last_empty_rowset_time"]) and rows[0]["backlog"] == 0

        wait_for(emptied, 60, "the tick's monitor row of the emptied queue", seen=lambda: last.get("row"))
    finally:
        w.stop()
    assert "SaslAuthenticationFailed" not in w.log.read_text()


def test_the_analytics_job_counts_on_the_secured_cluster(secure_admin, spark, tmp_path):
    from kbroker.analytics.job import AnalyticsJob, JobSettings
    from tests.integration.test_analytics import totals

    ns = fresh("a")
    apply_paths(secure_admin, ns, [SAMPLES])
    job = AnalyticsJob(
        JobSettings(
            cluster=secure_admin, namespace=ns, checkpoint=tmp_path / "ckpt", history=tmp_path / "history", trigger=1.0
        ),
        spark,
    ).start()
    try:
        with Broker(secure_admin, ns) as b:
            h = b.begin_dialog(EMP, EXP, CONTRACT)
            for i in range(7):
                b.send(h, CLAIM, {"claim": i})
        wait_for(
            lambda: totals(secure_admin, ns, "ExpenseQueue").get("arrivals") == 7, 120, "the job's count of 7 arrivals"
        )
    finally:
        job.stop()


def test_a_dialog_routed_between_a_plain_cluster_and_the_secured_one(
    kafka_bootstrap, secure_admin, tmp_path, monkeypatch
):
    # A reaches the secured cluster through a client profile its route names; B answers to the
    # plain cluster, which needs none.
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    text = secure_admin_properties(secure_admin)
    (profiles / "secured.properties").write_text(text)
    monkeypatch.setenv("KBROKER_PROFILES_DIR", str(profiles))
    a, b = fresh("ra"), fresh("rb")
    with two_namespaces(kafka_bootstrap, tmp_path, a, b, b_bootstrap=secure_admin, profile="secured") as (ba, bb, _):
        h = ba.begin_dialog(CLIENT, SERVER, ROUTED)
        for i in range(3):
            ba.send(h, REQUEST, {"i": i})
        got = []
        wait_for(lambda: got.extend(bb.receive("Q", top=10, wait=1.0)) or len(got) >= 3, 90, "requests at B")
        assert [orjson.loads(m.body)["i"] for m in got] == [0, 1, 2]
        bb.send(got[0].conversation_handle, REPLY, {"ok": True})
        replies = []
        wait_for(lambda: replies.extend(ba.receive("Q", top=10, wait=1.0)) or replies, 90, "the reply at A")
        assert orjson.loads(replies[0].body) == {"ok": True}


def secure_admin_properties(admin: Cluster) -> str:
    """A client profile of the secured cluster: its servers and the admin's settings."""
    lines = [f"bootstrap.servers={admin.bootstrap}"]
    lines += [f"{k}={v}" for k, v in admin.properties.items()]
    return "\n".join(lines) + "\n"


def test_a_transport_endpoint_sends_and_receives_on_the_secured_cluster(secure_admin):
    ns = fresh("t")
    with TransportEndpoint("Sales", cluster=secure_admin, namespace=ns, install=True) as ep:
        ep.send("Sales", b'{"order": 1}', {"NServiceBus.EnclosedMessageTypes": "Order"})
        msg = wait_for(lambda: ep.receive(wait=1.0), 30, "the message back")
        assert msg.body == b'{"order": 1}'
