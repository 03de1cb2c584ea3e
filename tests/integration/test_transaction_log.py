"""Kafka's transaction log as kbroker reads it to settle an in-doubt commit (core/txn/transaction_log.py,
kafka/txn/transaction_log.py), against the real broker: the records Kafka 4 writes parse, and the
last transaction before a producer's init reads as it ended, with its partitions."""

from __future__ import annotations

import logging
import struct
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.core import names
from kbroker.core.txn.transaction_log import TRANSACTION_LOG, outcome_before_init, partition_of
from kbroker.kafka.txn.transaction_log import transaction_history


def setting(kafka_bootstrap: str, namespace: str, partitions: int) -> tuple[AdminClient, str, str, dict, Producer]:
    """An admin (kept: its futures end with it), a topic of `partitions`, a transactional id, its
    producer configuration, and a producer of it, initialised."""
    topic = f"{names.prefix(namespace)}txnlog"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    tid = f"{names.prefix(namespace)}txn-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": kafka_bootstrap, "transactional.id": tid}
    first = Producer(conf)
    first.init_transactions(30)
    return admin, topic, tid, conf, first


@pytest.mark.parametrize("commit", [True, False])
def test_the_last_transaction_before_an_init_reads_as_it_ended(kafka_bootstrap, namespace, commit):
    began = time.time()
    _admin, topic, tid, conf, first = setting(kafka_bootstrap, namespace, 3)
    for outcome in ("commit", "abort" if not commit else "commit"):  # an earlier transaction, then the one read
        first.begin_transaction()
        first.produce(topic, b"v", partition=2 if outcome == "commit" and not commit else 1)
        first.flush(30)
        (first.commit_transaction if outcome == "commit" else first.abort_transaction)(30)
    Producer(conf).init_transactions(30)  # what the settling producer does
    history = transaction_history(kafka_bootstrap, names.reader_group(namespace), tid, began - 60, 30)
    assert history, "the transaction log had nothing for the id"
    found = outcome_before_init(history)
    assert found is not None and found.committed is commit
    assert found.partitions == {(topic, 1)}


def test_records_another_client_wrote_into_the_log_are_skipped_and_the_rest_is_read(kafka_bootstrap, namespace, caplog):
    """Kafka lets a client calling itself `__admin_client` write its internal topics: garbage, an
    oversize value, a forged key of the very id, forged headers. The history around them still
    reads, and says how the transaction ended."""
    began = time.time()
    admin, topic, tid, conf, first = setting(kafka_bootstrap, namespace, 1)
    first.begin_transaction()
    first.produce(topic, b"v", partition=0)
    first.commit_transaction(30)
    log_partition = partition_of(tid, len(admin.list_topics(timeout=30).topics[TRANSACTION_LOG].partitions))
    forger = Producer(
        {"bootstrap.servers": kafka_bootstrap, "client.id": "__admin_client", "message.max.bytes": 2_000_000}
    )
    own_key = struct.pack(">hh", 0, len(tid)) + tid.encode()
    for key, value, headers in [
        (own_key, b"\x00\x01garbage", None),
        (b"\xff" * 7, b"\x00" * 3, None),
        (own_key, b"\x00\x00" + b"\x07" * 900_000, None),
        (own_key, b"", [("kbroker-forged", b"\xff\xfe")]),
    ]:
        forger.produce(TRANSACTION_LOG, key=key, value=value, headers=headers, partition=log_partition)
    assert forger.flush(30) == 0, "the forged records were not written"
    Producer(conf).init_transactions(30)
    with caplog.at_level(logging.WARNING, logger="kbroker.committer"):
        history = transaction_history(kafka_bootstrap, names.reader_group(namespace), tid, began - 60, 30)
    assert history is not None
    found = outcome_before_init(history)
    assert found is not None and found.committed and found.partitions == {(topic, 0)}
    assert sum("not understood" in r.getMessage() for r in caplog.records) == 3  # the garbage key is not the id's
