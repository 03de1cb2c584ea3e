"""Group commit against the real broker: the commit window applies only while other transactions
are active, the active-transaction count returns to zero on every way out of a transaction, and
transactions committed in turn through the producer ring keep their order."""

from __future__ import annotations

import time

import orjson
import pytest

from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv
from tests.helpers import receive_at_least

WINDOW = 3.0  # a commit window far longer than any commit, so waiting on it is unmistakable


@pytest.fixture
def slow_window_broker(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, commit_interval=WINDOW)
    yield b
    b.close()


def _timed_commit(b: Broker, i: int) -> float:
    tx = b.transaction()
    h = tx.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    tx.send(h, inv.REQUEST, {"i": i})
    t0 = time.monotonic()
    tx.commit()
    return time.monotonic() - t0


def test_a_lone_transaction_does_not_wait_for_the_window(slow_window_broker):
    b = slow_window_broker
    _timed_commit(b, 0)  # first use starts the committer's producers
    assert b.runtime.active_transactions() == 0
    assert _timed_commit(b, 1) < WINDOW / 2


def test_an_active_transaction_holds_the_batch_open_until_the_window_ends(slow_window_broker):
    b = slow_window_broker
    _timed_commit(b, 0)
    other = b.transaction()  # active, may still commit: the committer waits for it
    assert b.runtime.active_transactions() == 1
    assert _timed_commit(b, 1) >= WINDOW * 0.9
    other.rollback()
    assert b.runtime.active_transactions() == 0
    assert _timed_commit(b, 2) < WINDOW / 2


def test_every_way_out_of_a_transaction_closes_it(slow_window_broker):
    b = slow_window_broker
    with b.transaction():
        pass  # nothing to commit
    with pytest.raises(RuntimeError):
        with b.transaction() as tx:
            h = tx.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
            tx.send(h, inv.REQUEST, {})
            raise RuntimeError("handler failed")
    tx = b.transaction()
    tx.commit()
    tx.rollback()  # after commit: a no-op, and not counted twice
    assert b.runtime.active_transactions() == 0


def test_transactions_in_turn_on_the_producer_ring_stay_in_order(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace)
    try:
        h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
        for i in range(12):  # one Kafka transaction each, alternating producers
            with b.transaction() as tx:
                tx.send(h, inv.REQUEST, {"i": i})
        assert b.runtime.committer.batches >= 12
        got = receive_at_least(b, "RequestQueue", 12)
        assert [orjson.loads(m.body)["i"] for m in got] == list(range(12))
    finally:
        b.close()
