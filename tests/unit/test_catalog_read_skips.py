"""Reading the catalog topic (no broker: a scripted consumer): a record that is not a catalog
object is skipped and logged, its key keeping its last valid object; for the catalog's writer
(apply) such a key is left out and reported, so it is published again. Before, one such record
made every read raise, in every process."""

from __future__ import annotations

import orjson

from kbroker.kafka.catalog.catalog_store import read_catalog_with
from kbroker.kafka.rejects import Rejects

from .fake_consumer import FakeConsumer, FakeMessage, eof

QUEUE = orjson.dumps({"name": "Q", "partitions": 1})


def read(messages: list[FakeMessage], last_bad: dict | None = None):
    records = [FakeMessage(0, i, m.key_, m.value_, topic_="kbroker.ns.catalog") for i, m in enumerate(messages)]
    consumer = FakeConsumer({0: (0, len(records))}, [records + [eof(0, len(records))]])
    rejects = Rejects("127.0.0.1:1", "ns", "test", record=False)
    catalog = read_catalog_with(consumer, "ns", [0], 5.0, rejects, last_bad=last_bad)  # type: ignore[arg-type]
    return catalog, rejects


def test_a_bad_record_leaves_its_key_with_its_last_valid_object():
    catalog, rejects = read(
        [
            FakeMessage(key_=b"queue/Q", value_=QUEUE),
            FakeMessage(key_=b"queue/Q", value_=b"{x"),
            FakeMessage(key_=b"service/S", value_=b'{"name": 5}'),
            FakeMessage(key_=b"\xff", value_=b"{}"),
            FakeMessage(key_=b"newkind/x", value_=b"anything"),
        ]
    )
    assert set(catalog.queues) == {"Q"} and "S" not in catalog.services
    assert rejects.rejected == 3  # the unknown kind is a newer kbroker's, not a bad record


def test_for_the_writer_a_key_whose_last_record_is_bad_is_left_out_and_reported():
    last_bad: dict = {}
    catalog, _ = read(
        [
            FakeMessage(key_=b"queue/Q", value_=QUEUE),
            FakeMessage(key_=b"queue/Q", value_=b"{x"),
            FakeMessage(key_=b"service/S", value_=b"[]"),
            FakeMessage(key_=b"service/S", value_=None),
        ],
        last_bad,
    )
    assert "Q" not in catalog.queues
    assert set(last_bad) == {b"queue/Q"}  # S's bad record was deleted after it: nothing to repair
    assert "not JSON" in last_bad[b"queue/Q"][1]


def test_a_tombstone_of_a_key_that_is_no_objects_is_not_a_bad_record():
    _, rejects = read([FakeMessage(key_=b"\xff/x", value_=None), FakeMessage(key_=b"no-kind", value_=None)])
    assert rejects.rejected == 0


def test_a_queue_record_with_a_forged_topic_key_is_skipped_and_an_old_one_reads_as_its_name():
    """topic_key names the queue's topic, so a record whose key Kafka could not take (or that
    would climb out of the queue space) is refused and the queue keeps its last valid record; a
    record without one, as a kbroker before keys wrote it, reads back with its name as key."""
    catalog, rejects = read(
        [
            FakeMessage(key_=b"queue/Q", value_=QUEUE),
            FakeMessage(key_=b"queue/Q", value_=orjson.dumps({"name": "Q", "partitions": 1, "topic_key": "../x"})),
            FakeMessage(key_=b"queue/Q", value_=orjson.dumps({"name": "Q", "partitions": 1, "topic_key": "k" * 121})),
            FakeMessage(key_=b"queue/Old_Q", value_=orjson.dumps({"name": "Old_Q", "partitions": 1})),
            FakeMessage(
                key_=b"queue/R.1", value_=orjson.dumps({"name": "R.1", "partitions": 1, "topic_key": "_R-2e-1"})
            ),
        ]
    )
    assert rejects.rejected == 2
    assert {n: q.topic_key for n, q in catalog.queues.items()} == {"Q": "Q", "Old_Q": "Old_Q", "R.1": "_R-2e-1"}
