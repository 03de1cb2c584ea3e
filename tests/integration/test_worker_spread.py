"""A namespace's queue monitors spread over as many workers as its monitor-events topic has
partitions: the first worker of a namespace chooses the count (`--monitor-partitions`), later
ones keep it and say so, and six workers share six queues' monitors, one each (the topic had 4
partitions, so 4 workers at most). ALTER QUEUE's event reaches the partition of the queue's
monitor, which the workers' own events for the queue take (aiokafka's murmur2, where every other
kbroker producer hashes with CRC-32): on another it made a second monitor of the queue."""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kbroker.core import names
from kbroker.core.activation import monitor_codec
from kbroker.core.activation.monitor import QueueAltered
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.queue_views import alter_queue_activation
from kbroker.worker.settings import WorkerSettings, ensure_topics, monitor_partition
from kbroker.worker.web.views import monitor_rows
from tests.helpers import wait_for
from tests.integration.test_catalog_apply import topic_config
from tests.integration.test_worker import Worker

PARTITIONS = 6  # of the monitor-events topic, chosen by the first worker
WORKERS = 6
CONTRACT, MESSAGE = "//kbroker/test/Spread", "//kbroker/test/SpreadJob"


def queue_per_partition(partitions: int) -> list[str]:
    """One queue name per monitor partition."""
    chosen: dict[int, str] = {}
    i = 0
    while len(chosen) < partitions:
        chosen.setdefault(monitor_partition(f"Spread{i}", partitions), f"Spread{i}")
        i += 1
    return [chosen[p] for p in range(partitions)]


def write_catalog(folder: Path, queues: list[str]) -> Path:
    activation = {"status": "ON", "procedure": "tests.helpers.procedures:slow_reader", "max_queue_readers": 1}
    catalog = {
        "message_types": [{"name": MESSAGE, "validation": "NONE"}],
        "contracts": [{"name": CONTRACT, "messages": [{"type": MESSAGE, "sent_by": "INITIATOR"}]}],
        "queues": [{"name": q, "partitions": 1, "activation": activation} for q in queues],
        "services": [{"name": f"//kbroker/test/{q}", "queue": q, "contracts": [CONTRACT]} for q in queues],
        "routes": [],
    }
    path = folder / "spread.yaml"
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return path


def partition_counts(bootstrap: str, *topics: str) -> dict[str, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spread-test"})
    try:
        meta = c.list_topics(timeout=10).topics
        return {t: len(meta[t].partitions) for t in topics if t in meta}
    finally:
        c.close()


def partitions_holding(
    bootstrap: str, topic: str, key: bytes, partitions: int, value: Callable[[bytes], bool] = lambda v: True
) -> set[int]:
    """The partitions of `topic` with a record keyed `key` whose value passes `value`, read from
    the start to the end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spread-test", "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        found, ended, deadline = set(), set(), time.monotonic() + 30
        while len(ended) < partitions and time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                ended.add(msg.partition())
            elif msg.key() == key and value(msg.value()):
                found.add(msg.partition())
        assert len(ended) == partitions, f"{topic} not read to its end in 30 s"
        return found
    finally:
        c.close()


def owners(bootstrap: str, ns: str, queues: list[str]) -> dict[str, str]:
    return {r["queue"]: r["worker"] for r in monitor_rows(bootstrap, ns) if r["queue"] in queues}


def test_the_tables_changelogs_exist_before_faust_subscribes(kafka_bootstrap):
    """ensure_topics makes both tables' changelogs, compacted and partitioned as their tables,
    before the worker's Faust app starts: a changelog Faust makes itself can be missing from the
    metadata it subscribes with, and its recovery then waits for ever."""
    ns = "changelogs" + uuid.uuid4().hex[:8]
    partitions = ensure_topics(WorkerSettings(kafka_bootstrap, ns, monitor_partitions=3))
    monitors, tick_owner = names.monitors_changelog_topic(ns), names.tick_owner_changelog_topic(ns)
    assert partitions == 3
    assert partition_counts(kafka_bootstrap, monitors, tick_owner) == {monitors: 3, tick_owner: 1}
    assert {topic_config(kafka_bootstrap, t)["cleanup.policy"] for t in (monitors, tick_owner)} == {"compact"}
    assert ensure_topics(WorkerSettings(kafka_bootstrap, ns, monitor_partitions=5)) == 3  # kept as made


@pytest.mark.long  # 40 s, six workers: `make test-long`
def test_six_workers_share_six_queues_monitors_and_alter_reaches_the_monitor(kafka_bootstrap, tmp_path):
    ns = "spread" + uuid.uuid4().hex[:8]
    queues = queue_per_partition(PARTITIONS)
    apply_paths(kafka_bootstrap, ns, [write_catalog(tmp_path, queues)])
    first = Worker(kafka_bootstrap, ns, tmp_path, "--monitor-partitions", str(PARTITIONS))
    workers = [first]
    try:
        first.wait_ready()
        monitor_topic, changelog = names.monitor_events_topic(ns), names.monitors_changelog_topic(ns)
        # Later workers ask for another count: the topic keeps the first worker's.
        workers += [Worker(kafka_bootstrap, ns, tmp_path, "--monitor-partitions", "3") for _ in range(WORKERS - 1)]
        for w in workers:
            w.wait_ready(timeout=150)
        ids = {w.id for w in workers}
        assert len(ids) == WORKERS
        spread = wait_for(
            lambda: (
                (o := owners(kafka_bootstrap, ns, queues)) and len(o) == PARTITIONS and set(o.values()) == ids and o
            ),
            150,
            f"each of the {WORKERS} workers owning one queue's monitor",
        )
        assert partition_counts(kafka_bootstrap, monitor_topic, changelog) == {
            monitor_topic: PARTITIONS,
            changelog: PARTITIONS,
        }
        for w in workers[1:]:
            assert f"keeps its {PARTITIONS} partitions" in w.log.read_text(), w.log.read_text()[-2000:]
        assert "keeps its" not in first.log.read_text()
        print(f"\n{WORKERS} workers, {PARTITIONS} monitor partitions: monitors owned by {len(set(spread.values()))}")

        # A queue that CRC-32 (kbroker's other producers) and murmur2 put on different partitions.
        altered = next(q for q in queues if zlib.crc32(q.encode()) % PARTITIONS != monitor_partition(q, PARTITIONS))
        alter_queue_activation(kafka_bootstrap, ns, altered, status="OFF")
        home = monitor_partition(altered, PARTITIONS)

        def is_altered(value: bytes) -> bool:
            return isinstance(monitor_codec.decode(value)[0], QueueAltered)

        assert partitions_holding(kafka_bootstrap, monitor_topic, altered.encode(), PARTITIONS, is_altered) == {home}
        time.sleep(5)  # five ticks: a monitor made on another partition would have written its row
        assert partitions_holding(kafka_bootstrap, changelog, f'"{altered}"'.encode(), PARTITIONS) == {home}
    finally:
        for w in workers:
            w.stop()
