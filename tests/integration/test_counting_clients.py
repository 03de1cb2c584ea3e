"""The worker's queue watch and receive progress count many queues through one set of Kafka
clients (kafka/activation/counting_clients.py): one offsets reader per queue group and a scanning consumer
per thread counting at once. A process holds about 1,000 librdkafka clients at most; with a
client per queue for each of the two, a worker of 500 queues ran out."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import yaml
from confluent_kafka import TopicPartition

from kbroker.bench.scale.many_queues import CONTRACT, INITIATOR, MESSAGE, catalog, queue_name
from kbroker.core.names import queue_group, queue_topic
from kbroker.kafka import clients
from kbroker.kafka.activation.counting_clients import CountingClients
from kbroker.kafka.activation.watch import QueueWatcher
from kbroker.kafka.analytics.results import ProgressPublisher
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.clients import idempotent_producer
from kbroker.sdk.broker import Broker

QUEUES, THREADS = 24, 8


@contextmanager
def shared_counting(bootstrap: str, ns: str, names: list[str]) -> Iterator[tuple[CountingClients, Callable, Callable]]:
    """One set of counting clients, a watcher per queue and the progress publisher over it, as
    the worker has them: (the clients, every queue's counts now, every queue's progress snapshot
    now), each counted on THREADS threads."""
    counting = CountingClients(bootstrap, ns)
    watchers = {name: QueueWatcher(bootstrap, ns, name, clients=counting) for name in names}
    publisher = ProgressPublisher(bootstrap, ns, counting)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            yield (
                counting,
                lambda: dict(zip(names, pool.map(lambda n: watchers[n].counts(timeout=10), names))),
                lambda: {s["queue"]: s for s in pool.map(lambda n: publisher.snapshot(n, timeout=10), names) if s},
            )
    finally:
        publisher.close()
        for w in watchers.values():
            w.close()
        counting.close()


def test_many_queues_are_counted_exactly_with_a_client_per_queue_and_one_per_thread(kafka_bootstrap, tmp_path):
    ns = f"counting-{uuid.uuid4().hex[:8]}"
    (tmp_path / "scale.yaml").write_text(yaml.safe_dump(catalog(QUEUES, 2), sort_keys=False))
    apply_paths(kafka_bootstrap, ns, [tmp_path])
    names = [queue_name(i) for i in range(QUEUES)]
    sent = {name: i % 4 for i, name in enumerate(names)}  # 0 to 3 messages a queue, each its own dialog
    with Broker(kafka_bootstrap, ns) as broker:
        with broker.transaction() as tx:
            for name, n in sent.items():
                for j in range(n):
                    tx.send(tx.begin_dialog(INITIATOR, f"//scale/{name}", CONTRACT), MESSAGE, {"j": j})
        received = dict.fromkeys(names, 0)
        for name in names[:6]:  # one message of some queues received: their committed offsets move
            if sent[name]:
                received[name] = len(broker.receive(name, top=1, wait=15))

    with shared_counting(kafka_bootstrap, ns, names) as (counting, count_all, snapshot_all):
        counts, snapshots, again = count_all(), snapshot_all(), count_all()
        assert {n: c.backlog for n, c in counts.items()} == {n: sent[n] - received[n] for n in names}
        assert {n: c.ready_groups for n, c in counts.items()} == {n: sent[n] - received[n] for n in names}
        assert all(c.exact for c in counts.values()) and again == counts
        # What the progress says was received: each partition's position, and what was completed
        # above it (a RECEIVE may take any ready dialog, not the partition's first record).
        assert {
            q: sum((p["committed"] or 0) + len(p["completed"]) for p in s["partitions"]) for q, s in snapshots.items()
        } == received
        # One offsets reader per queue group, shared by the watch and the progress, and no more
        # scanning consumers than threads that counted at once.
        assert QUEUES < counting.clients <= QUEUES + THREADS, counting.clients


def test_a_watcher_without_shared_clients_makes_and_closes_its_own(kafka_bootstrap, tmp_path):
    ns = f"counting-{uuid.uuid4().hex[:8]}"
    (tmp_path / "scale.yaml").write_text(yaml.safe_dump(catalog(1, 2), sort_keys=False))
    apply_paths(kafka_bootstrap, ns, [tmp_path])
    watcher = QueueWatcher(kafka_bootstrap, ns, queue_name(0))
    try:
        assert watcher.counts(timeout=10).backlog == 0
    finally:
        watcher.close()
    assert watcher._clients.clients == 0  # closed with the watcher


def test_what_another_client_wrote_to_a_queue_or_its_group_is_counted_and_the_rest_goes_on(kafka_bootstrap, tmp_path):
    """Anyone who may write a queue's topic may write anything there, and anyone who may commit
    for its group may commit any metadata: the counts take a foreign record as one more waiting
    (a reader sets it aside as it reads it), read forged commit metadata as nothing completed,
    and every other queue's counts stay exact."""
    ns = f"counting-{uuid.uuid4().hex[:8]}"
    (tmp_path / "scale.yaml").write_text(yaml.safe_dump(catalog(3, 2), sort_keys=False))
    apply_paths(kafka_bootstrap, ns, [tmp_path])
    names = [queue_name(i) for i in range(3)]
    sent = {names[0]: 2, names[1]: 1, names[2]: 2}
    with Broker(kafka_bootstrap, ns) as broker, broker.transaction() as tx:
        for name, n in sent.items():
            for j in range(n):
                tx.send(tx.begin_dialog(INITIATOR, f"//scale/{name}", CONTRACT), MESSAGE, {"j": j})
    foreign_topic = queue_topic(ns, names[0])
    producer = idempotent_producer(kafka_bootstrap)
    foreign = [b"\xff\x00 not json", None, b"{" * 900_000, b'{"conversation_handle": 7}']
    for value in foreign:
        producer.produce(foreign_topic, value=value, headers=[("kb.message_type", b"\xff" * 300), ("kb.forged", b"")])
    assert producer.flush(30) == 0
    forged = clients.consumer(kafka_bootstrap, queue_group(ns, names[1]))
    try:
        forged.commit(
            offsets=[
                TopicPartition(queue_topic(ns, names[1]), p, 0, "\xff garbage |by:" + "x" * 500) for p in range(2)
            ],
            asynchronous=False,
        )
    finally:
        forged.close()

    with shared_counting(kafka_bootstrap, ns, names) as (_counting, count_all, snapshot_all):
        counts, snapshots = count_all(), snapshot_all()
        assert {n: c.backlog for n, c in counts.items()} == {
            names[0]: sent[names[0]] + len(foreign),
            names[1]: 1,
            names[2]: 2,
        }
        # Two dialogs and the foreign records' one (absent) key.
        assert counts[names[0]].ready_groups == 3 and counts[names[2]].ready_groups == 2
        assert [(p["committed"], p["completed"]) for p in snapshots[names[1]]["partitions"]] == [(0, []), (0, [])]
