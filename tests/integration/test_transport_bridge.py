"""Queues on another cluster (`queue@namespace@cluster`, kbroker/core/transport/bridge.py), against
two real brokers, the session's and one of this module's own: a request and its reply and a
delayed send across the clusters; a send to a far queue nobody installed, and garbage another
client wrote to the bridge topic, set aside here while the bridge goes on; garbage on the far
positions topic, which leaves the last good position standing; and the
invariant run: 3,000 messages pushed through kill -9 of the pushing instance and a second one
competing for the bridge, counted on the far queue by a plain read_committed consumer, 0 lost and
0 duplicated."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kbroker.core import names
from kbroker.core.transport.bridge import bridge_topic
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.core.transport.message import TransportMessage
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import TransportQueueNotFoundError
from kbroker.kafka import clients
from kbroker.sdk.transport.endpoint import TransportEndpoint
from tests.helpers import ROOT, free_port, wait_for


@pytest.fixture(scope="module")
def far(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    node = EmbeddedBroker(tmp_path_factory.mktemp("far-kafka"))
    try:
        bootstrap = node.start(port=free_port(), controller_port=free_port()).bootstrap
        assert bootstrap is not None
        yield bootstrap
    finally:
        node.stop()


def read_all(bootstrap: str, topic: str, seconds: float = 5.0) -> list[bytes]:
    """Every committed record's key (b"" for none) on `topic` (partitions 0-3), read for `seconds`."""
    c = clients.consumer(bootstrap, names.reader_group("count"))
    keys: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in c.consume(500, 0.3):
                if m.error() is None:
                    keys.append(m.key() or b"")
    finally:
        c.close()
    return keys


def test_a_request_its_reply_and_a_delayed_send_cross_clusters(kafka_bootstrap: str, namespace: str, far: str) -> None:
    far_ns = "b" + uuid.uuid4().hex[:10]
    billing = TransportEndpoint(
        "Billing",
        cluster=far,
        namespace=far_ns,
        machine="m2",
        install=True,
        bridges={"hq": kafka_bootstrap},
        cluster_name="eu",
    )
    sales = TransportEndpoint(
        "Sales",
        cluster=kafka_bootstrap,
        namespace=namespace,
        machine="m1",
        install=True,
        bridges={"eu": far},
        cluster_name="hq",
    )
    got: list[TransportMessage] = []
    try:
        billing.start(lambda msg, tx: tx.reply(msg, b"paid:" + (msg.body or b"")))
        sales.start(lambda msg, tx: got.append(msg))
        reply = sales.request(f"Billing@{far_ns}@eu", b"order-1").result(60)
        assert reply.body == b"paid:order-1"
        sent = time.monotonic()
        sales.send(f"Billing@{far_ns}@eu", b"later", delay=1.5)
        wait_for(lambda: got, 60, "the delayed send's reply")
        assert got[0].body == b"paid:later" and time.monotonic() - sent >= 1.5
        sales.send(f"Nobody@{far_ns}@eu", b"lost?")  # no such far queue: set aside here
        wait_for(lambda: sales.pushers["eu"].stats()["set_aside"] == 1, 30, "the send set aside")
        garbage = clients.producer(kafka_bootstrap)  # another client writes what it likes
        garbage.produce(bridge_topic(namespace, "eu"), key=b"k", value=b"\x00 not a message")
        garbage.produce(bridge_topic(namespace, "eu"), value=b"x", headers=[("Destination", b"Billing")])
        garbage.flush(10)
        assert sales.request(f"Billing@{far_ns}@eu", b"order-2").result(60).body == b"paid:order-2"
        wait_for(lambda: sales.pushers["eu"].stats()["set_aside"] == 3, 30, "the garbage set aside")
        letters = read_all(kafka_bootstrap, names.deadletter_topic(namespace), 3.0)
        assert len(letters) == 3
        with pytest.raises(TransportQueueNotFoundError):
            sales.send(f"Billing@{far_ns}@nowhere", b"no bridge there")
    finally:
        sales.close()
        billing.close()


def test_pushed_exactly_once_through_kill_9_and_a_competing_pusher(
    kafka_bootstrap: str, namespace: str, far: str, tmp_path: Path
) -> None:
    far_ns = "b" + uuid.uuid4().hex[:10]
    TransportEndpoint("Billing", cluster=far, namespace=far_ns, machine="m2", install=True, secondary=False).close()
    sales = TransportEndpoint(
        "Sales", cluster=kafka_bootstrap, namespace=namespace, install=True, bridges={"eu": far}, secondary=False
    )
    far_topic = transport_queue_topic(far_ns, "Billing")

    def instance(machine: str) -> subprocess.Popen[bytes]:
        args = [kafka_bootstrap, namespace, "eu", far, machine]
        return subprocess.Popen([sys.executable, "-m", "tests.helpers.bridge_instance", *args], cwd=ROOT)

    total = 3000
    first = instance("p1")
    second: subprocess.Popen[bytes] | None = None
    try:
        for i in range(total):  # the instance pushes while these are sent
            with sales.transaction() as tx:
                tx.send(f"Billing@{far_ns}@eu", str(i).encode(), message_id=str(uuid.UUID(int=i + 1)))
            if i == 1000:
                wait_for(lambda: len(read_all(far, far_topic, 1.0)) > 100, 60, "the first pushes")
                first.kill()  # kill -9, pushing
                first.wait()
                first = instance("p2")
                second = instance("p3")  # a competing pusher: the bridge's partition goes to one
        wait_for(lambda: len(read_all(far, far_topic, 1.0)) >= total, 120, "every message pushed")
        keys = read_all(far, far_topic, 4.0)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)
        sales.close()
    counts = Counter(keys)
    dupes = sum(n - 1 for n in counts.values() if n > 1)
    lost = total - len(counts)
    print(f"bridge invariant run: {len(counts)} distinct of {total}, {lost} lost, {dupes} duplicated")
    assert (lost, dupes) == (0, 0)


@pytest.mark.kafka_cluster  # about a minute: `make test-long`
def test_pushed_exactly_once_through_a_far_broker_restart(kafka_bootstrap: str, namespace: str, tmp_path: Path) -> None:
    node = EmbeddedBroker(tmp_path / "far-kafka")
    port, cport = free_port(), free_port()
    far_bootstrap = node.start(port=port, controller_port=cport).bootstrap
    assert far_bootstrap is not None
    far_ns = "b" + uuid.uuid4().hex[:10]
    try:
        for name in ("Billing", "Shipping"):  # Shipping's first message is pushed during the outage
            TransportEndpoint(
                name, cluster=far_bootstrap, namespace=far_ns, machine="m2", install=True, secondary=False
            ).close()
        sales = TransportEndpoint(
            "Sales",
            cluster=kafka_bootstrap,
            namespace=namespace,
            install=True,
            bridges={"eu": far_bootstrap},
            secondary=False,
        )
        far_topics = [transport_queue_topic(far_ns, q) for q in ("Billing", "Shipping")]
        total = 600

        def pushed(seconds: float) -> list[bytes]:
            return [k for t in far_topics for k in read_all(far_bootstrap, t, seconds)]

        try:
            sales.start(lambda msg, tx: None)
            for i in range(total):
                with sales.transaction() as tx:
                    queue = "Shipping" if i >= 300 and i % 2 else "Billing"
                    tx.send(f"{queue}@{far_ns}@eu", str(i).encode(), message_id=str(uuid.UUID(int=i + 1)))
                if i == 200:
                    node.stop()  # the far cluster goes away while pushes are under way
                if i == 400:
                    node.start(port=port, controller_port=cport)
            wait_for(lambda: len(pushed(0.5)) >= total, 180, "every message pushed")
            keys = pushed(3.0)
        finally:
            sales.close()
    finally:
        node.stop(timeout=20)
    counts = Counter(keys)
    lost, dupes = total - len(counts), sum(n - 1 for n in counts.values() if n > 1)
    print(f"bridge through a far restart: {len(counts)} distinct of {total}, {lost} lost, {dupes} duplicated")
    assert (lost, dupes) == (0, 0)


def test_a_push_that_fails_before_its_transaction_reads_again_from_the_far_position(
    kafka_bootstrap: str, namespace: str, far: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    import kbroker.kafka.transport.bridge as bridge

    real, failures = bridge.topic_partitions, []

    def flaky(*a: object, **kw: object) -> object:  # the far look-up fails once, after records were read
        if not failures:
            failures.append(1)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "injected: the far cluster went away"))
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(bridge, "topic_partitions", flaky)
    far_ns = "b" + uuid.uuid4().hex[:10]
    TransportEndpoint("Billing", cluster=far, namespace=far_ns, machine="m2", install=True, secondary=False).close()
    sales = TransportEndpoint(
        "Sales", cluster=kafka_bootstrap, namespace=namespace, install=True, bridges={"eu": far}, secondary=False
    )
    try:
        with sales.transaction() as tx:
            for i in range(50):
                tx.send(f"Billing@{far_ns}@eu", str(i).encode(), message_id=str(uuid.UUID(int=i + 1)))
        sales.start(lambda msg, tx: None)
        far_topic = transport_queue_topic(far_ns, "Billing")
        wait_for(lambda: len(read_all(far, far_topic, 0.5)) >= 50, 60, "every message pushed")
        keys = read_all(far, far_topic, 2.0)
    finally:
        sales.close()
    assert failures == [1] and sorted(Counter(keys).values()) == [1] * 50


def test_garbage_on_the_far_positions_topic_leaves_the_positions_and_the_pushes_as_they_were(
    kafka_bootstrap: str, namespace: str, far: str
) -> None:
    from kbroker.core.transport.bridge import position_key, positions_topic

    far_ns = "b" + uuid.uuid4().hex[:10]
    TransportEndpoint("Billing", cluster=far, namespace=far_ns, machine="m2", install=True, secondary=False).close()
    far_topic = transport_queue_topic(far_ns, "Billing")

    def sales() -> TransportEndpoint:
        return TransportEndpoint(
            "Sales", cluster=kafka_bootstrap, namespace=namespace, install=True, bridges={"eu": far}, secondary=False
        )

    def send(ep: TransportEndpoint, first: int, n: int) -> None:
        with ep.transaction() as tx:
            for i in range(first, first + n):
                tx.send(f"Billing@{far_ns}@eu", str(i).encode(), message_id=str(uuid.UUID(int=i + 1)))

    ep = sales().start(lambda msg, tx: None)
    try:
        send(ep, 0, 20)
        wait_for(lambda: len(read_all(far, far_topic, 0.5)) >= 20, 60, "the first pushes")
        source = ep.pushers["eu"]._source
    finally:
        ep.close()
    junk = clients.producer(far)  # another client writes what it likes to the far positions topic
    ours = position_key(source, bridge_topic(namespace, "eu"), 0)
    for key, value in [
        (b"k", b"\x00 not json"),
        (None, b"{}"),
        (ours, b"not json"),
        (ours, b'{"next": -5}'),
        (ours, b'{"next": "20"}'),
        (ours, b"x" * 100_000),
    ]:
        junk.produce(positions_topic(namespace), key=key, value=value)
    junk.flush(10)
    ep = sales()
    try:
        send(ep, 20, 20)
        ep.start(lambda msg, tx: None)
        wait_for(
            lambda: len(read_all(far, far_topic, 0.5)) >= 40,
            60,
            "the pushes after the garbage",
            seen=lambda: (len(read_all(far, far_topic, 2.0)), ep.pushers["eu"].stats(), ep.pushers["eu"].denied),
        )
        keys = read_all(far, far_topic, 2.0)
    finally:
        ep.close()
    assert sorted(Counter(keys).values()) == [1] * 40  # the last good position held: none pushed again
