"""Adaptive polling readers (NServiceBus 2.1 ramp-up) on the real broker."""

from __future__ import annotations

import threading
import time

import orjson

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.sdk.pollers import PollerPool, ReaderPool


def test_a_backlog_grows_the_pool_to_its_maximum_and_idle_shrinks_it_to_one(broker):
    with broker.transaction() as tx:
        for c in range(200):
            h = tx.begin_dialog(EMP, EXP, CONTRACT)
            tx.send(h, CLAIM, {"c": c})
    seen, lock = [], threading.Lock()
    current, concurrent = [0], [0]

    def handle(tx, msgs):
        with lock:
            current[0] += 1
            concurrent[0] = max(concurrent[0], current[0])
        time.sleep(0.02)
        with lock:
            current[0] -= 1
            seen.extend(orjson.loads(m.body)["c"] for m in msgs)

    assert ReaderPool is PollerPool  # the name it was first published under
    pool = PollerPool(broker, "ExpenseQueue", handle, max_readers=4, top=1, wait=0.5).start()
    try:
        deadline = time.time() + 90
        while len(seen) < 200 and time.time() < deadline:
            time.sleep(0.1)
        assert sorted(seen) == list(range(200)), "lost or duplicated messages"
        assert pool.peak == 4 and concurrent[0] <= 4, (pool.peak, concurrent[0])
        deadline = time.time() + 30
        while pool.readers > 1 and time.time() < deadline:
            time.sleep(0.2)
        assert pool.readers == 1, "an idle queue keeps exactly one poller"
    finally:
        pool.stop()
    assert pool.readers == 0


def test_a_failing_handler_rolls_back_and_the_message_comes_again(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"c": 1})
    calls = []

    def handle(tx, msgs):
        calls.append(msgs[0].message_id)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    pool = PollerPool(broker, "ExpenseQueue", handle, max_readers=1, wait=0.5).start()
    try:
        deadline = time.time() + 30
        while len(calls) < 2 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        pool.stop()
    assert len(calls) == 2 and calls[0] == calls[1] and pool.failures == 1 and pool.handled == 1
