"""Competing consumers of a transport endpoint's primary queue, one of them killed with SIGKILL
(the transport face, kbroker/sdk/transport/endpoint.py). See tests/helpers/transport_instance.py for what
each instance does: it forwards every input's number to the `Processed` queue in the
transaction that removes the input, so the read_committed `Processed` topic is exactly the
committed handlings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kbroker.core.transport.endpoint import install_plan, transport_queue_topic
from kbroker.core.transport.message import new_message, to_headers
from kbroker.kafka.transport.queues import install
from kbroker.sdk.transport.endpoint import TransportEndpoint
from tests.helpers import ROOT

N = 3000  # messages sent to Orders
ORDERS_PARTITIONS = 6
PROCESSED_PARTITIONS = 3
INSTANCES = ("i0", "i1", "i2")
VICTIM = "i1"
SLEEP_MS = 2.0  # in each handler's transaction, so the run lasts a while
MAX_CONCURRENCY = 2  # per instance (monitor model: receive tasks at most)
KILL_AT = N // 4  # committed handlings (all instances) before the victim is killed
VICTIM_AT_LEAST = 30  # ... of which the victim's, so its death matters
DELAY_EVERY = 10  # every 10th message goes through the delayed store (tests/helpers/transport_instance.py)
PUBLISH_EVERY = 7  # ... and every 7th, once done, publishes an event Processed subscribes to
RETRY_EVERY = 11  # ... and every 11th fails its first delivery, retried through the delayed store


class Tail:
    """A plain read_committed consumer of a whole topic (assigned, no group), read
    incrementally: `records` is every committed record seen so far, as decoded JSON."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed"):
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"test-tail-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        self.partitions = list(range(partitions))
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        self.records: list[dict] = []
        self.eof: set[int] = set()

    def poll(self, seconds: float) -> None:
        """Read what arrives within `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            m = self.consumer.poll(min(left, 0.2))
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    self.eof.add(m.partition())
                    continue
                raise AssertionError(f"reading {self.topic}: {m.error()}")
            self.eof.discard(m.partition())
            self.records.append(json.loads(m.value()))

    def at_end(self) -> bool:
        """Every partition read to its end (its high watermark; nothing open holds it back)."""
        if self.eof != set(self.partitions):
            return False
        for p in self.partitions:
            _low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
            pos = self.consumer.position([TopicPartition(self.topic, p)])[0].offset
            if pos < high:  # positions past a commit marker reach the high watermark
                return False
        return True

    def read_to_end(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not self.at_end():
            assert time.monotonic() < deadline, f"could not read {self.topic} to its end in {timeout} s"
            self.poll(0.5)
        return self.records

    def close(self) -> None:
        self.consumer.close()


def produce_orders(bootstrap: str, topic: str, n: int) -> None:
    """n transport messages to Orders, body {"n": i}, by a plain idempotent producer (no
    transaction, so a partition's end offset is its last message's plus one)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    errors: list = []
    for i in range(n):
        msg = new_message(
            json.dumps({"n": i}).encode(),
            {"NServiceBus.EnclosedMessageTypes": "PlaceOrder"},
            now_ms=int(time.time() * 1000),
        )
        producer.produce(
            topic,
            key=msg.id.encode(),
            value=msg.body,
            headers=to_headers(msg),
            on_delivery=lambda err, _m: err and errors.append(err),
        )
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, f"producing Orders: {errors[:3]}"


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-ends-{uuid.uuid4().hex[:8]}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def nothing_after(bootstrap: str, topic: str, committed: dict[int, int], ends: dict[int, int]) -> bool:
    """Whether every partition is committed and no record waits after its committed offset: the
    offset is the end offset, or only control records (transaction markers) lie between."""
    if set(committed) != set(ends) or not ends:
        return False
    behind = {p: off for p, off in committed.items() if off < ends[p]}
    if not behind:
        return True
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-after-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, off) for p, off in behind.items()])
        eof: set[int] = set()
        deadline = time.monotonic() + 10
        while eof != set(behind) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is None:
                return False  # a record waits
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
        return eof == set(behind)
    finally:
        c.close()


def committed_offsets(admin: AdminClient, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (stable ones: a pending transactional commit is waited out)."""
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    try:
        got = admin.list_consumer_group_offsets([req], require_stable=True, request_timeout=10)[group].result(15)
    except Exception:  # noqa: BLE001 - unstable offsets while a transaction is open: ask again
        return {}
    return {tp.partition: tp.offset for tp in got.topic_partitions if not tp.error}


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `timeout`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.mark.long  # 30 s, three instances: `make test-long`
@pytest.mark.timeout(300)
def test_kill_9_of_one_of_three_competing_instances_loses_and_duplicates_nothing(
    kafka_bootstrap, namespace, tmp_path: Path
):
    """3000 messages in Orders (6 partitions), three instances competing for them, each
    forwarding every input's number to Processed in the transaction that removes the input;
    every 10th is first deferred through the endpoint's delayed store (sent to Orders again
    with a delay of 0.3-1.5 s), so rows wait in the store, in the victim's partitions too; and
    every 7th, once done, publishes an event Processed is subscribed to, in the same transaction;
    every 11th fails its first delivery and comes back by a delayed retry; and every message
    handled is audited.
    Once a quarter is done, one instance is killed with SIGKILL (transactions open); the other
    two take over its partitions after the group's session time-out and Kafka's abort of its
    open transactions, and finish. Processed (read_committed) then holds every number done
    exactly once, every deferred number deferred exactly once and every event published exactly
    once, Audited holds each handled message exactly once, and the Orders group's
    committed offsets are the queue's end offsets."""
    started_at = time.monotonic()
    orders_topic = transport_queue_topic(namespace, "Orders")
    processed_topic = transport_queue_topic(namespace, "Processed")
    install(kafka_bootstrap, namespace, install_plan("Orders", None, partitions=ORDERS_PARTITIONS))
    install(kafka_bootstrap, namespace, install_plan("Processed", None, partitions=PROCESSED_PARTITIONS))
    install(kafka_bootstrap, namespace, install_plan("Audited", None, partitions=PROCESSED_PARTITIONS))
    audited_topic = transport_queue_topic(namespace, "Audited")
    with TransportEndpoint("Processed", cluster=kafka_bootstrap, namespace=namespace, secondary=False) as processed:
        processed.subscribe("OrderAccepted")
    produce_orders(kafka_bootstrap, orders_topic, N)
    ends = end_offsets(kafka_bootstrap, orders_topic, ORDERS_PARTITIONS)
    assert sum(ends.values()) == N and all(ends.values()), f"Orders partitions' end offsets: {ends}"

    procs: dict[str, subprocess.Popen] = {}
    logs = {k: tmp_path / f"{k}.log" for k in INSTANCES}
    stats_files = {k: tmp_path / f"{k}.stats.json" for k in INSTANCES}
    tail = Tail(kafka_bootstrap, processed_topic, PROCESSED_PARTITIONS)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for k in INSTANCES:
            with open(logs[k], "w") as log:
                procs[k] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.helpers.transport_instance",
                        kafka_bootstrap,
                        namespace,
                        "Orders",
                        k,
                        "Processed",
                        str(SLEEP_MS),
                        str(MAX_CONCURRENCY),
                        str(stats_files[k]),
                        str(DELAY_EVERY),
                        str(PUBLISH_EVERY),
                        str(RETRY_EVERY),
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

        # A quarter done, the victim having committed some of it: kill -9.
        deadline = time.monotonic() + 60
        while True:
            tail.poll(0.2)
            by = Counter(r["by"] for r in tail.records)
            if len(tail.records) >= KILL_AT and by[VICTIM] >= VICTIM_AT_LEAST:
                break
            for k, p in procs.items():
                assert p.poll() is None, f"instance {k} ended early ({p.returncode}): {logs[k].read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"no kill point within 60 s: {len(tail.records)} handled, by instance {dict(by)}"
            )
        os.kill(procs[VICTIM].pid, signal.SIGKILL)
        procs[VICTIM].wait(10)
        killed_at = time.monotonic()
        tail.poll(0.5)
        seen_at_kill = len(tail.records)
        print(
            f"\nkilled {VICTIM} after {killed_at - started_at:.1f} s with {seen_at_kill} handled, "
            f"by instance {dict(Counter(r['by'] for r in tail.records))}"
        )

        # The survivors take over (session time-out 10 s, open transactions aborted after 10 s
        # plus the broker's check interval) and remove everything, the deferred messages
        # included (the victim's share of the delayed store moved by a survivor's mover): every
        # number done, and the committed offsets at the queue's end offsets (which grew by the
        # delayed messages moved in, each move's commit marker last: nothing left after them).
        deadline = time.monotonic() + 120
        committed: dict[int, int] = {}
        ends: dict[int, int] = {}
        while (
            len({r["n"] for r in tail.records if r["kind"] == "done"}) < N
            or len({r["n"] for r in tail.records if r["kind"] == "published"}) < len(range(0, N, PUBLISH_EVERY))
            or not nothing_after(kafka_bootstrap, orders_topic, committed, ends)
        ):
            assert time.monotonic() < deadline, (
                f"the Orders group did not commit to the end within 120 s of the kill: committed {committed}, "
                f"end offsets {ends}, {len(tail.records)} handled"
            )
            for k, p in procs.items():
                if k != VICTIM:
                    assert p.poll() is None, f"survivor {k} ended ({p.returncode}): {logs[k].read_text()[-3000:]}"
            tail.poll(1.0)
            ends = end_offsets(kafka_bootstrap, orders_topic, ORDERS_PARTITIONS)
            committed = committed_offsets(admin, orders_topic, orders_topic, ORDERS_PARTITIONS)
        done_at = time.monotonic()
        print(f"Orders group committed to the end {done_at - killed_at:.1f} s after the kill")

        for k in INSTANCES:
            if k != VICTIM:
                stop_process(procs[k])
                assert procs[k].returncode == 0, (
                    f"survivor {k} exited {procs[k].returncode}: {logs[k].read_text()[-3000:]}"
                )
        records = tail.read_to_end(60)
        audit_tail = Tail(kafka_bootstrap, audited_topic, PROCESSED_PARTITIONS)
        try:
            audits = audit_tail.read_to_end(60)
        finally:
            audit_tail.close()
        # What the victim forwarded but never committed (its transactions open at the kill,
        # aborted by Kafka): read_uncommitted sees those records too. Reported, not asserted.
        everything = Tail(kafka_bootstrap, processed_topic, PROCESSED_PARTITIONS, "read_uncommitted")
        try:
            uncommitted = everything.read_to_end(60)
        finally:
            everything.close()
    finally:
        for p in procs.values():
            stop_process(p, 10)
        tail.close()

    counts = Counter(r["n"] for r in records if r["kind"] == "done")
    deferred = Counter(r["n"] for r in records if r["kind"] == "deferred")
    published = Counter(r["n"] for r in records if r["kind"] == "published")
    lost = [n for n in range(N) if counts[n] == 0]
    duplicated = sorted(n for n, c in counts.items() if c > 1)
    unknown = sorted(n for n in counts if not 0 <= n < N)
    expected_deferred = {n for n in range(N) if n % DELAY_EVERY == 0}
    by = Counter(r["by"] for r in records)
    survivors = {k: by[k] for k in INSTANCES if k != VICTIM}
    stats = {k: json.loads(stats_files[k].read_text()) for k in INSTANCES if k != VICTIM}
    aborted = Counter(r["by"] for r in uncommitted) - by
    print(
        f"{N} messages, {len(records)} handled: lost {len(lost)}, duplicated {len(duplicated)}, "
        f"by instance {dict(by)}; survivors' stats {[(k, s['counters']) for k, s in stats.items()]}; "
        f"forwarded but aborted (not committed) {dict(aborted)}; {time.monotonic() - started_at:.1f} s in all"
    )
    assert len(lost) == 0, f"{len(lost)} lost, e.g. {lost[:10]}"
    assert len(duplicated) == 0, (
        f"{len(duplicated)} duplicated, e.g. {[[r for r in records if r['n'] == n] for n in duplicated[:3]]}"
    )
    assert unknown == [] and sum(counts.values()) == N
    # Each deferred message was deferred once and delivered once (above), through the store.
    assert set(deferred) == expected_deferred and all(c == 1 for c in deferred.values()), deferred
    # Each event published once, in the transaction that made its number done.
    assert set(published) == set(range(0, N, PUBLISH_EVERY)) and max(published.values()) == 1, published
    assert len(records) == N + len(expected_deferred) + len(published)
    # Every message handled (inputs, and the deferred ones when they came back) audited exactly
    # once, in its handler's transaction; those that failed first came back through a delayed
    # retry (none reached the error queue: each was done above).
    audited = Counter((a["n"], bool(a.get("delayed"))) for a in audits)
    expected_audits = {(n, False) for n in range(N)} | {(n, True) for n in expected_deferred}
    assert set(audited) == expected_audits and max(audited.values()) == 1, (
        f"audited {len(audits)}: missing {len(expected_audits - set(audited))}, "
        f"twice {[k for k, c in audited.items() if c > 1][:5]}"
    )
    assert set(by) <= set(INSTANCES)
    # The test means something: the victim had committed some before dying, and the survivors
    # handled the rest, including messages of partitions the victim had been handling.
    assert by[VICTIM] >= VICTIM_AT_LEAST, dict(by)
    assert by[VICTIM] < N and sum(survivors.values()) == len(records) - by[VICTIM], dict(by)
    assert all(c > 0 for c in survivors.values()), dict(by)
    victim_last: dict[int, int] = {}  # Orders partition -> the last offset the victim committed
    for r in records:
        if r["by"] == VICTIM:
            victim_last[r["p"]] = max(victim_last.get(r["p"], -1), r["o"])
    taken_over = {
        r["p"] for r in records if r["by"] != VICTIM and r["p"] in victim_last and r["o"] > victim_last[r["p"]]
    }
    assert taken_over, f"no partition the victim handled was finished by a survivor: {victim_last}"
    # Each survivor's committed transactions are what it forwarded (its events beside them), and
    # its delayed retries: the first deliveries that failed, which commit their move.
    handled = Counter(r["by"] for r in records if r["kind"] != "published")
    for k, s in stats.items():
        c = s["counters"]
        assert c.get("committed", 0) == handled[k], (k, c, handled[k])
        assert c.get("errors", 0) == 0, (k, c)
    retried = sum(s["counters"].get("delayed_retries", 0) for s in stats.values())
    assert retried >= len(range(0, N, RETRY_EVERY)) // 2, stats  # most of them, the victim's aside
