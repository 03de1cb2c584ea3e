"""A catalog record that is not a catalog object is reported once, by the worker's 5th-tick scan
that dead-letters it (kafka/rejects.py), not again by every process that reads the catalog: each
CLI call and SDK process reads the compacted topic from its start, and met it again (and a bad
record that followed a valid value of its key stays there for good), so every `kbroker` command
printed "catalog reader: record ...@N set aside" for records set aside long ago. The readers still
skip it, at DEBUG."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import Producer

from kbroker.core import names
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.catalog.models import Catalog
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import CatalogWatcher, read_catalog
from kbroker.kafka.rejects import Rejects, scan
from kbroker.kafka.snapshot import read_to_end
from tests.helpers import SAMPLES


def produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
    """One record, as any client may write it: its (partition, offset) once acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap})  # a plain client: no kbroker rules
    delivered: list[tuple[object, int, int]] = []
    producer.produce(
        topic, key=key, value=value, on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset()))
    )
    assert producer.flush(15) == 0 and delivered and delivered[0][0] is None, delivered
    return delivered[0][1], delivered[0][2]


def set_aside(caplog: pytest.LogCaptureFixture, where: str) -> list[tuple[int, str]]:
    """(level, line) of each log line that says the record at `where` was set aside."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if f"record {where} set aside" in r.getMessage()]


def test_a_catalog_record_set_aside_is_reported_once_not_by_every_reader(kafka_bootstrap, namespace, caplog):
    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    topic = names.catalog_topic(namespace)
    # One with no valid value before it (the scan tombstones its key), one after a valid value of
    # its key (only recorded: it stays, the last of its key, until its key is written again).
    lone = produce(kafka_bootstrap, topic, b"service/Bogus", b'{"name": 5}')
    after_valid = produce(kafka_bootstrap, topic, b"queue/ExpenseQueue", b"{not json")
    bad = [f"{topic}[{p}]@{o}" for p, o in (lone, after_valid)]

    with caplog.at_level(logging.DEBUG, logger="kbroker"):
        rejects = Rejects(kafka_bootstrap, namespace, "5th-tick scan")  # the tick owner's (worker/activation/tick.py)
        scan(rejects, topic, lambda msg: catalog_record(msg.key(), msg.value()))
        rejects.close()
        assert rejects.rejected == 2
        for _ in range(2):  # two CLI calls, each reading the catalog whole
            catalog = read_catalog(kafka_bootstrap, namespace, 10.0)
            assert "Bogus" not in catalog.services and "ExpenseQueue" in catalog.queues  # skipped
        read: list[Catalog] = []
        got = threading.Event()
        watcher = CatalogWatcher(
            kafka_bootstrap, namespace, lambda c: (read.append(c), got.set()), interval=0.1
        ).start()  # an SDK process's
        try:
            assert got.wait(30), "the catalog watcher's first read"
        finally:
            watcher.close()
        assert "ExpenseQueue" in read[0].queues

    for where in bad:
        lines = set_aside(caplog, where)
        said = [line for level, line in lines if level >= logging.WARNING]
        assert len(said) == 1 and said[0].startswith("5th-tick scan:"), lines  # by the scan, once
        assert len(lines) >= 4, lines  # the readers still meet it (two reads, the watcher's): quietly
    letters = [
        dict(m.headers() or []) for m in read_to_end(kafka_bootstrap, names.deadletter_topic(namespace), 15) or []
    ]
    recorded = sorted(int(h["kb.dlq.offset"]) for h in letters if h.get("kb.dlq.topic") == topic.encode())
    assert recorded == sorted(o for _, o in (lone, after_valid))  # and dead-lettered once, by the scan
