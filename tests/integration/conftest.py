"""One Kafka broker for the whole test session, chosen by the project's broker rule:
KBROKER_BOOTSTRAP if set, else a testcontainers Kafka when a Docker engine answers, else the
embedded Apache Kafka on free ports with a temporary data dir. When none can be had the fixture
fails with the reason: no test skips for want of a broker. Every test collected under this folder
is marked `integration` (`pytest -m integration`)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kbroker.core.cluster import Cluster
from kbroker.embedded.broker import KAFKA_VERSION, EmbeddedBroker
from kbroker.kafka.dialogs.timer_service import TimerService
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, docker_engine_answers, embedded_kafka, free_port

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees every item of the session: mark only those collected under this folder.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of the session's Kafka broker (started on first use)."""
    env = os.environ.get("KBROKER_BOOTSTRAP")
    if env:
        yield env
        return
    if docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        try:
            container = KafkaContainer(f"apache/kafka:{KAFKA_VERSION}").with_kraft()
            container.start()
        except Exception as exc:  # noqa: BLE001 - any failure is reported  # pragma: no cover - only where Docker runs
            pytest.fail(f"Docker answers but the Kafka container did not start: {exc}")
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()
        return
    with embedded_kafka(tmp_path_factory.mktemp("kafka")) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session", autouse=True)
def routing_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's directory of namespaces' routing keys (kafka/routing/keys.py), also for the
    workers tests start: one directory, so every namespace trusts the others, as on one machine."""
    directory = tmp_path_factory.mktemp("keys")
    os.environ["KBROKER_KEYS_DIR"] = str(directory)
    return directory


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A secured embedded broker for the session, on free ports beside the plain one: SASL_SSL
    (SCRAM-SHA-512, PLAIN), a mutual-TLS listener, the StandardAuthorizer denying what no ACL
    allows. Its admin's client properties file is `status().client_properties`."""
    node = EmbeddedBroker(tmp_path_factory.mktemp("secure-kafka"))
    try:
        node.start(port=free_port(), controller_port=free_port(), tls_port=free_port(), secure=True)
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def secure_admin(secure_kafka: EmbeddedBroker) -> Cluster:
    """The secured broker as its admin (a super user), from the properties file kbroker wrote:
    Java client property names, translated for each client."""
    from kbroker.embedded import resolve_cluster

    status = secure_kafka.status()
    return resolve_cluster(status.bootstrap, command_config=status.client_properties)


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test, so tests never see each other's topics."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def broker(kafka_bootstrap: str, namespace: str) -> Iterator[Broker]:
    """A Broker on a fresh namespace with the sample catalog (topics/samples) applied."""
    from kbroker.kafka.catalog.apply import apply_paths

    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


@pytest.fixture
def timer_service(kafka_bootstrap: str, namespace: str, broker: Broker) -> Iterator[TimerService]:
    """The timer service of the test's namespace, running (it fires dialog timers and lifetimes)."""
    svc = TimerService(kafka_bootstrap, namespace).start()
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (a start costs seconds), with Spark's
    Kafka source on its classpath."""
    from kbroker.analytics.session import spark_session

    session = spark_session("local[2]", {"spark.driver.memory": "1g"})
    yield session
    session.stop()


@pytest.fixture
def start_analytics(spark, kafka_bootstrap: str, tmp_path: Path):
    """start_analytics(namespace, **settings): the analytics job of `namespace` running in the
    session's Spark (a 1 s trigger unless given), stopped after the test."""
    from kbroker.analytics.job import AnalyticsJob, JobSettings

    jobs = []

    def start(namespace: str, **settings):
        s = JobSettings(
            cluster=kafka_bootstrap,
            namespace=namespace,
            checkpoint=tmp_path / f"ckpt-{namespace}",
            history=tmp_path / f"history-{namespace}",
            **{"trigger": 1.0, **settings},
        )
        job = AnalyticsJob(s, spark).start()
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.stop()


@pytest.fixture
def endpoints(kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., Any]]:
    """endpoints(name, machine=..., **settings): a transport endpoint instance, installed unless
    install=False, closed after the test (the transport tests' maker)."""
    from kbroker import transport

    made: list[Any] = []

    def make(name: str, machine: str = "m1", **kw: Any) -> Any:
        kw.setdefault("install", True)
        ep = transport.endpoint(name, bootstrap=kafka_bootstrap, namespace=namespace, machine=machine, **kw)
        made.append(ep)
        return ep

    yield make
    for ep in reversed(made):
        ep.close()
