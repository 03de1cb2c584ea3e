"""The secure embedded broker, for real: its own data dir and free ports (not the session broker).
confluent-kafka clients log in as admin with SCRAM-SHA-512 and PLAIN, a user added with `kbroker
broker user add` with SCRAM and with its client certificate (denied without ACLs), and nothing
gets in without credentials or with a wrong password; `user remove` ends the SCRAM login, and a
restart stays secure with the same certificates.

The clients are given librdkafka's setting names (what kbroker's client factory takes as they
are); the properties files kbroker writes hold the Java names, checked as text."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import NewTopic

from kbroker.core.cluster import Cluster
from kbroker.embedded import resolve_cluster
from kbroker.embedded.broker import BrokerStatus, EmbeddedBroker, wait_ready
from kbroker.embedded.secure import read_properties
from kbroker.errors import AuthenticationFailedError, BrokerUnavailableError, PermissionDeniedError, kafka_error
from kbroker.kafka import clients
from tests.helpers import free_port, run_kbroker_module

JAAS = re.compile(r'(\w+)LoginModule required username="([^"]+)" password="([^"]+)";')


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A secure embedded broker of this module's own, started on free ports."""
    broker = EmbeddedBroker(tmp_path_factory.mktemp("secure-kafka"))
    try:
        broker.start(port=free_port(), controller_port=free_port(), tls_port=free_port(), secure=True)
    except Exception as exc:  # noqa: BLE001 - fail with whatever went wrong
        broker.stop()
        pytest.fail(f"the secure broker did not start: {exc}")
    yield broker
    broker.stop()


def status_of(broker: EmbeddedBroker) -> BrokerStatus:
    st = broker.status()
    assert st.running and st.bootstrap and st.port and st.tls_port
    return st


def sasl(broker: EmbeddedBroker, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> Cluster:
    """The broker's SASL_SSL listener as `user`."""
    return Cluster.with_properties(
        status_of(broker).bootstrap or "",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(broker.secure_files.ca),
        },
    )


def login_of(properties: Path) -> tuple[str, str, str]:
    """(module, user, password) of a properties file's JAAS line."""
    found = JAAS.search(read_properties(properties)["sasl.jaas.config"])
    assert found, properties.read_text()
    return found.group(1), found.group(2), found.group(3)


def admin_password(broker: EmbeddedBroker) -> str:
    module, user, password = login_of(broker.secure_files.admin_properties)
    assert (module, user) == ("Scram", "admin")
    return password


def cli(*args: str) -> Any:
    out = run_kbroker_module(*args, "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def produce_one(cluster: Cluster, topic: str, **overrides: Any) -> Any:
    """Produce one record; its delivery error (None when acknowledged)."""
    delivered: list[Any] = []
    producer = clients.producer(cluster, **overrides)
    producer.produce(topic, key=b"k", value=b"v", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and len(delivered) == 1
    return delivered[0]


def read_one(cluster: Cluster, topic: str) -> Any:
    consumer = clients.consumer(cluster, "kb-secure-" + uuid.uuid4().hex[:6])
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return msg
    finally:
        consumer.close()
    raise AssertionError(f"nothing to read in {topic} within 30 s")


def new_topic(admin_cluster: Cluster) -> str:
    topic = "kb-secure-" + uuid.uuid4().hex[:8]
    admin = clients.admin(admin_cluster)
    clients.result_of(admin.create_topics([NewTopic(topic, 1, 1)])[topic], f"creating {topic}")
    return topic


def test_the_admin_creates_produces_transacts_and_consumes_over_scram(secure: EmbeddedBroker) -> None:
    admin = sasl(secure, "admin", admin_password(secure))
    topic = new_topic(admin)
    assert produce_one(admin, topic) is None
    # A transaction's commit markers travel the inter-broker listener, as User:kbroker-broker.
    txn = clients.transactional_producer(admin, "kb-secure")
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, key=b"t", value=b"committed")
    txn.commit_transaction(30)
    msg = read_one(admin, topic)
    assert (msg.key(), msg.value()) == (b"k", b"v")
    assert clients.brokers_answering(admin) == 1


def test_the_admin_logs_in_with_plain_too(secure: EmbeddedBroker) -> None:
    admin = sasl(secure, "admin", admin_password(secure), mechanism="PLAIN")
    topic = new_topic(admin)
    assert produce_one(admin, topic) is None
    assert read_one(admin, topic).value() == b"v"


def test_no_credentials_never_get_metadata_and_are_told_tls_is_wanted(secure: EmbeddedBroker) -> None:
    st = status_of(secure)
    sasl_plaintext = Cluster.with_properties(
        f"127.0.0.1:{st.port}",
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "a", "sasl.password": "b"},
    )
    for plaintext, protocol in ((f"127.0.0.1:{st.port}", "PLAINTEXT"), (sasl_plaintext, "SASL_PLAINTEXT")):
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match=f"answers but closes {protocol} connections.*wants TLS"):
            clients.brokers_answering(plaintext, timeout=10)
        assert time.monotonic() - started < 8  # told at the first closed connections, not after the wait
    tls_only = Cluster.with_properties(
        f"127.0.0.1:{st.tls_port}", {"security.protocol": "SSL", "ssl.ca.location": str(secure.secure_files.ca)}
    )
    with pytest.raises((BrokerUnavailableError, AuthenticationFailedError)):
        clients.brokers_answering(tls_only, timeout=3)  # TLS without a client certificate


def test_a_wrong_password_is_an_authentication_failure_not_an_absent_broker(secure: EmbeddedBroker) -> None:
    wrong = sasl(secure, "admin", "not-the-password")
    with pytest.raises(AuthenticationFailedError, match="SASL authentication"):
        clients.brokers_answering(wrong, timeout=5)

    class Running:  # the JVM as wait_ready sees it: still running
        def poll(self) -> None:
            return None

    started = time.monotonic()
    with pytest.raises(AuthenticationFailedError):
        wait_ready([(Running(), wrong, secure.log_file)], 1, 60)  # type: ignore[list-item]
    assert time.monotonic() - started < 30  # not the whole wait


def test_the_cli_says_a_wrong_password_or_a_plaintext_client_in_one_line(
    secure: EmbeddedBroker, tmp_path: Path
) -> None:
    """`kbroker queue show` meets a transport failure reading metadata: the one-line error names
    the refused login, or the TLS the listener wants, not "Broker transport failure"."""
    st = status_of(secure)
    good = secure.secure_files.admin_properties.read_text()
    wrong = tmp_path / "wrong.properties"
    wrong.write_text(re.sub(r'password="[^"]*"', 'password="not-the-password"', good))
    plain = tmp_path / "plain.properties"
    plain.write_text(f"bootstrap.servers={st.bootstrap}\n")
    expected = {wrong: "refused kbroker: .*SASL authentication", plain: "closes PLAINTEXT connections.*wants TLS"}
    for properties, says in expected.items():
        out = run_kbroker_module(
            "queue", "show", "Anything", "--bootstrap", st.bootstrap or "", "--command-config", str(properties)
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert re.search(says, lines[0]) and "transport failure" not in lines[0], lines[0]


def test_a_user_added_logs_in_with_scram_and_its_certificate_and_is_denied_without_acls(secure: EmbeddedBroker) -> None:
    st = status_of(secure)
    added = cli("broker", "user", "add", "carol", "--data-dir", str(secure.data_dir))
    assert login_of(Path(added["scram"]))[:2] == ("Scram", "carol")
    assert login_of(Path(added["plain"]))[:2] == ("Plain", "carol")
    mtls_file = Path(added["mtls"])
    assert f"bootstrap.servers=127.0.0.1:{st.tls_port}" in mtls_file.read_text()
    assert read_properties(mtls_file)["ssl.keystore.location"] == added["cert"]

    carol = sasl(secure, "carol", login_of(Path(added["scram"]))[2])
    assert clients.brokers_answering(carol, timeout=10) == 1
    topic = new_topic(sasl(secure, "admin", admin_password(secure)))
    by_certificate = Cluster.with_properties(
        f"127.0.0.1:{st.tls_port}",
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(secure.secure_files.ca),
            "ssl.certificate.location": added["cert"],
            "ssl.key.location": added["cert"],
        },
    )
    assert clients.brokers_answering(by_certificate, timeout=10) == 1
    err = produce_one(by_certificate, topic, **{"message.timeout.ms": 20000})
    assert err is not None and err.name() == "TOPIC_AUTHORIZATION_FAILED"
    assert isinstance(kafka_error("producing", err), PermissionDeniedError)


def test_a_removed_user_can_no_longer_log_in(secure: EmbeddedBroker) -> None:
    added = cli("broker", "user", "add", "dave", "--data-dir", str(secure.data_dir))
    dave = sasl(secure, "dave", login_of(Path(added["scram"]))[2])
    assert clients.brokers_answering(dave, timeout=10) == 1
    assert cli("broker", "user", "remove", "dave", "--data-dir", str(secure.data_dir)) == {
        "user": "dave",
        "removed": True,
    }
    assert not any(Path(added[kind]).exists() for kind in ("scram", "plain", "mtls", "cert"))
    with pytest.raises(AuthenticationFailedError):
        clients.brokers_answering(dave, timeout=5)
    out = run_kbroker_module("broker", "user", "remove", "admin", "--data-dir", str(secure.data_dir))
    assert out.returncode != 0 and "kbroker's own user" in out.stderr


def test_resolve_cluster_gives_the_admin_properties_file(secure: EmbeddedBroker) -> None:
    st = status_of(secure)
    cluster = resolve_cluster(data_dir=secure.data_dir)
    assert cluster.bootstrap == st.bootstrap
    assert cluster.properties == read_properties(secure.secure_files.admin_properties)
    assert cluster.properties["security.protocol"] == "SASL_SSL" and "bootstrap.servers" not in cluster.properties


def test_a_restart_without_secure_stays_secure_with_the_same_certificates(secure: EmbeddedBroker) -> None:
    # Last in this module: the broker runs on other ports afterwards.
    files = secure.secure_files
    kept = {p: p.read_bytes() for p in (files.ca, files.keystore)}
    assert cli("broker", "stop", "--data-dir", str(secure.data_dir))["stopped"]
    port = free_port()
    out = run_kbroker_module(
        "broker",
        "start",
        "--data-dir",
        str(secure.data_dir),
        "--port",
        str(port),
        "--controller-port",
        str(free_port()),
        "--tls-port",
        str(free_port()),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"127.0.0.1:{port}", str(files.admin_properties)]
    st = status_of(secure)
    assert st.secure and st.port == port and st.client_properties == files.admin_properties
    assert f"bootstrap.servers=127.0.0.1:{port}" in files.admin_properties.read_text()
    assert {p: p.read_bytes() for p in kept} == kept
    assert clients.brokers_answering(sasl(secure, "admin", admin_password(secure))) == 1
    with pytest.raises(BrokerUnavailableError):
        clients.brokers_answering(st.bootstrap or "", timeout=3)  # still no PLAINTEXT


def test_a_secure_cluster_replicates_for_its_admin_and_shuts_out_plaintext(tmp_path: Path) -> None:
    from kbroker.embedded.cluster import EmbeddedCluster

    cluster = EmbeddedCluster(tmp_path / "secure-cluster", 3)
    try:
        st = cluster.start(port=free_port(), secure=True)
        assert st.secure and st.nodes_running == 3 and st.tls_bootstrap
        assert st.client_properties == cluster.secure_files.admin_properties
        assert f"bootstrap.servers={st.bootstrap}" in st.client_properties.read_text()
        assert all(n.tls_port for n in st.nodes)
        admin = cluster.secure_files.admin_cluster(st.bootstrap or "")
        assert clients.brokers_answering(admin) == 3
        topic = "kb-secure-" + uuid.uuid4().hex[:8]
        client = clients.admin(admin)
        clients.result_of(client.create_topics([NewTopic(topic, 1, 3)])[topic], f"creating {topic}")
        assert produce_one(admin, topic, acks="all") is None
        with pytest.raises(BrokerUnavailableError):
            clients.brokers_answering(st.bootstrap or "", timeout=3)
        assert resolve_cluster(data_dir=cluster.data_dir).properties == read_properties(
            cluster.secure_files.admin_properties
        )
    finally:
        cluster.stop()
