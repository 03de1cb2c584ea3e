"""A reader killed inside its group commit (offsets sent to its Kafka transaction, the commit not
yet asked for) leaves that transaction open. Its partition's next owner fences the transactional
ids the partition's last committed offsets name (kafka/receive/open_transaction_fence.py) instead of waiting for
Kafka to abort it: before, the partition sat unread for transaction.timeout.ms plus the broker's
check (11 s here); now about the group session (2 s) and one second more."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
import uuid

import orjson
from confluent_kafka import Consumer, TopicPartition

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.txn.commit_holder import MAX_IDS
from kbroker.kafka.receive.open_transaction_fence import OpenTransactionFence
from kbroker.sdk.broker import Broker

# Seconds from the killed reader's exit until the next owner has its message. Kafka's own abort
# takes 10 s + 1 s here; the takeover is the 2 s group session, then 1 s of waiting and the fence.
BOUND = 8.0

CHILD = textwrap.dedent("""
    import os, signal, sys
    from kbroker.kafka.txn import guarded
    from kbroker.sdk.broker import Broker

    bootstrap, namespace = sys.argv[1:]
    commits = 0
    init = guarded.GuardedProducer.__init__

    class Dying:
        # The producer, killing the process at its second commit_transaction.

        def __init__(self, producer):
            self._producer = producer

        def __getattr__(self, name):
            return getattr(self._producer, name)

        def commit_transaction(self, *args):
            global commits
            commits += 1
            if commits == 2:  # the offsets are in the open transaction; the commit never comes
                os.kill(os.getpid(), signal.SIGKILL)
            return self._producer.commit_transaction(*args)

    def dying_init(self, producer, name):
        init(self, Dying(producer), name)

    guarded.GuardedProducer.__init__ = dying_init
    broker = Broker(bootstrap, namespace)
    for _ in range(2):
        with broker.transaction() as tx:
            got = tx.receive("ExpenseQueue", top=1, wait=60)
            # A reply, so the commit is a Kafka transaction (one that wrote nothing is not).
            tx.send(got[0].conversation_handle, "//Adventure-Works.com/Expenses/ExpenseApproval", {})
            print(got[0].body.decode(), flush=True)
""")


def test_a_reader_killed_inside_its_commit_holds_the_partition_only_until_it_is_fenced(
    kafka_bootstrap, namespace, broker, caplog
):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(3):
        broker.send(h, CLAIM, {"i": i})
    child = subprocess.run(
        [sys.executable, "-c", CHILD, kafka_bootstrap, namespace], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, child.stderr[-3000:]
    # It committed the first and was killed committing the second.
    assert [orjson.loads(line)["i"] for line in child.stdout.split()] == [0, 1], child.stdout
    died = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kbroker.receiver"), Broker(kafka_bootstrap, namespace) as next_owner:
        with next_owner.transaction() as tx:
            got = tx.receive("ExpenseQueue", wait=60)
            took = time.monotonic() - died
    # The killed commit's message comes again, after the committed one, nothing twice.
    assert [orjson.loads(m.body)["i"] for m in got] == [1, 2], got
    assert took < BOUND, f"the partition waited {took:.1f} s for the open transaction: {caplog.text}"
    assert "fencing" in caplog.text, caplog.text


def test_forged_commit_metadata_names_nothing_outside_the_namespace_and_the_queue_is_read_on(
    kafka_bootstrap, namespace, broker
):
    """The fence reads what any client with the group's READ may have committed. Garbage, an
    oversized holder, ids of another namespace: it fences at most MAX_IDS ids per partition, all
    under this namespace, raises nothing, and a reader then receives every message."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(3):
        broker.send(h, CLAIM, {"i": i})
    topic = names.queue_topic(namespace, "ExpenseQueue")
    real = uuid.uuid4()
    forged = [
        "\xff not ours \u2603|by:../../x,kbroker.other.txn",
        "kb1:!!!|by:" + ",".join(uuid.uuid4().hex for _ in range(80)),  # about 2,700 bytes
        f"|by:{real.hex},{real.hex},kbroker.{namespace}.{uuid.uuid4()}",
        "|by:",
    ]
    foreign = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic, "enable.auto.commit": False})
    try:
        foreign.commit(
            offsets=[TopicPartition(topic, p, 0, metadata=m) for p, m in enumerate(forged)], asynchronous=False
        )
    finally:
        foreign.close()

    fence = OpenTransactionFence(kafka_bootstrap, namespace, topic, ())
    try:
        fenced = fence([TopicPartition(topic, p) for p in range(4)])
    finally:
        fence.close()
    assert all(tid.startswith(f"kbroker.{namespace}.") for tid in fenced), fenced
    assert f"kbroker.{namespace}.{real}" in fenced and len(fenced) <= MAX_IDS + 1, fenced

    with broker.transaction() as tx:
        got = tx.receive("ExpenseQueue", wait=60)
    assert [orjson.loads(m.body)["i"] for m in got] == [0, 1, 2], got
