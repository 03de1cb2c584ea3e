"""Kafka's transaction log as kbroker reads it to settle an in-doubt commit (core/txn_log.py,
kafka/transaction_log.py), against the real broker: the records Kafka 4 writes parse, and the
last transaction before a producer's init reads as it ended, with its partitions."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.core import names
from kbroker.core.txn_log import outcome_before_init
from kbroker.kafka.transaction_log import transaction_history


@pytest.mark.parametrize("commit", [True, False])
def test_the_last_transaction_before_an_init_reads_as_it_ended(kafka_bootstrap, namespace, commit):
    topic = f"{names.prefix(namespace)}txnlog"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept: its futures end with it
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)
    tid = f"{names.prefix(namespace)}txn-{uuid.uuid4().hex[:8]}"
    began = time.time()
    conf = {"bootstrap.servers": kafka_bootstrap, "transactional.id": tid}
    first = Producer(conf)
    first.init_transactions(30)
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
