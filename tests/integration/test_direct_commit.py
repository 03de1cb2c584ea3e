"""A transaction that wrote nothing commits its offsets with the queue consumer's own commit, not
a Kafka transaction (kafka/txn/offset_commit.py, kafka/receive/poll_commits.py), against the real
broker: its messages are gone for the next process, one that sent goes the transactional way, a
rollback gives them back, and a second process joining while such transactions hold groups takes
every message once (none lost, none received twice by committed transactions)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import orjson
import pytest

from kbroker import errors
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv

QUEUE = "RequestQueue"


@pytest.fixture
def ns(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    return namespace


def requests(b: Broker, n: int, each: int = 1, start: int = 0) -> None:
    """n messages numbered from `start`, `each` on every dialog (a dialog's first RECEIVE writes
    its target endpoint, so its transaction is a Kafka transaction; the later ones wrote nothing)."""
    for i in range(start, start + n):
        if (i - start) % each == 0:
            h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
        b.send(h, inv.REQUEST, {"i": i})


def test_a_receive_only_commit_is_no_kafka_transaction_and_sticks(kafka_bootstrap, ns):
    sender = Broker(kafka_bootstrap, ns)
    reader = Broker(kafka_bootstrap, ns)
    try:
        requests(sender, 6, each=6)
        with reader.transaction() as tx:  # the dialog's first: its target endpoint written
            got = [m.body for m in tx.receive(QUEUE, top=1, wait=30)]
        with reader.transaction() as tx:  # rolled back: back on the queue
            assert len(tx.receive(QUEUE, top=1, wait=30)) == 1
            tx.rollback()
        kafka_transactions = reader.runtime.committer.batches - reader.runtime.committer.direct_commits
        while len(got) < 6:
            with reader.transaction() as tx:
                got += [m.body for m in tx.receive(QUEUE, top=1, wait=30)]
        assert [orjson.loads(b)["i"] for b in got] == list(range(6))
        assert reader.runtime.committer.direct_commits == 5
        assert reader.runtime.committer.batches - reader.runtime.committer.direct_commits == kafka_transactions
        with reader.transaction() as tx:  # one that sends: a Kafka transaction, as before
            tx.send(sender.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT), inv.REQUEST, {"i": 6})
        assert reader.runtime.committer.batches - reader.runtime.committer.direct_commits == kafka_transactions + 1
    finally:
        reader.close()
    again = Broker(kafka_bootstrap, ns)
    try:
        left = again.receive(QUEUE, wait=30)  # the sent one only: the six committed stay removed
        assert [orjson.loads(m.body) for m in left] == [{"i": 6}] and not again.receive(QUEUE, wait=3)
    finally:
        again.close()
        sender.close()


def test_a_reader_joining_while_receive_only_transactions_hold_groups_takes_each_message_once(kafka_bootstrap, ns):
    """Two processes' worth of readers (two Brokers, each its own queue consumer) take 300
    messages on 60 dialogs, one a transaction (receive-only but for a dialog's first, whose
    target endpoint is written: both kinds of commit interleave), the second joining mid-run (a
    rebalance moves partitions while transactions hold their groups): every message is received
    by exactly one committed transaction. The second half is sent once the second reader owns
    partitions, so both readers commit both ways whatever the first took before it joined."""
    sender = Broker(kafka_bootstrap, ns)
    requests(sender, 150, each=5)
    committed: Counter[int] = Counter()
    lock, stop, failures = threading.Lock(), threading.Event(), []

    def read(b: Broker) -> None:
        while not stop.is_set():
            try:
                with b.transaction() as tx:
                    taken = [
                        orjson.loads(m.body)["i"]
                        for batch in tx.receive_groups(QUEUE, groups=5, top=1, wait=0.5)
                        for m in batch
                    ]
                    time.sleep(0.02 if taken else 0)  # held across the rebalance now and then
            except errors.TransactionAbortedError as exc:  # fenced or moved: received again
                failures.append(type(exc).__name__)
                continue
            with lock:
                committed.update(taken)

    first, second = Broker(kafka_bootstrap, ns), None
    threads = [threading.Thread(target=read, args=(first,), daemon=True) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while sum(committed.values()) < 60:
            assert time.monotonic() < deadline, "the first reader never got going"
            time.sleep(0.05)
        second = Broker(kafka_bootstrap, ns)
        more = [threading.Thread(target=read, args=(second,), daemon=True) for _ in range(2)]
        for t in more:
            t.start()
        threads += more
        deadline = time.monotonic() + 60
        while not second.runtime.receiver(QUEUE).stats()["partitions"]:
            assert time.monotonic() < deadline, "the second reader was given no partition"
            time.sleep(0.05)
        requests(sender, 150, each=5, start=150)
        deadline = time.monotonic() + 120
        while len(committed) < 300 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # a late duplicate would show now
        direct = [b.runtime.committer.direct_commits for b in (first, second)]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for b in (first, second, sender):
            if b is not None:
                b.close()
    lost = sorted(set(range(300)) - set(committed))
    twice = sorted(i for i, c in committed.items() if c > 1)
    print(
        f"committed={sum(committed.values())} lost={len(lost)} twice={len(twice)} aborted={Counter(failures)} direct={direct}"
    )
    assert not lost and not twice, (lost[:5], twice[:5])
    assert direct[0] > 0 and direct[1] > 0, f"direct commits: {direct}"
