"""A RECEIVE that waits returns as soon as a message arrives, and a read of the endpoints topic
as soon as it reached the end: neither waits out its consumer's poll timeout. The timeouts are
raised to 5 s here, so a poll that waits them out (consume(500, wait) waits unless 500 records
come) fails the test instead of adding a few tens of milliseconds."""

from __future__ import annotations

import threading
import time

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.kafka import snapshot
from kbroker.kafka.receive import poll_loop

LONG_WAIT = 5.0


def test_a_waiting_receive_returns_once_the_message_is_there(broker, monkeypatch):
    monkeypatch.setattr(poll_loop, "POLL_WAIT", LONG_WAIT)
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"claim": 0})
    assert len(broker.receive("ExpenseQueue", top=10, wait=30)) == 1  # assigned, polling
    for i in range(1, 4):
        got: list[float] = []  # the thread's own list: one still running after join() cannot fill the next round's
        t = threading.Thread(
            target=lambda into: into.extend(time.monotonic() for _ in broker.receive("ExpenseQueue", top=10, wait=30)),
            args=(got,),
        )
        t.start()
        time.sleep(1.0)  # the poll thread is inside a poll with nothing to read
        broker.send(h, CLAIM, {"claim": i})
        sent = time.monotonic()
        t.join(30)
        assert got, "the message was not received"
        assert got[0] - sent < LONG_WAIT / 2, f"received {got[0] - sent:.2f} s after the SEND"


def test_reading_the_endpoints_topic_ends_at_its_end(broker, monkeypatch):
    monkeypatch.setattr(snapshot, "CONSUME_WAIT", LONG_WAIT)
    handles = [broker.begin_dialog(EMP, EXP, CONTRACT) for _ in range(3)]
    store = broker.endpoints
    t0 = time.monotonic()
    store.refresh()  # the records just written are there: the read ends at each partition's EOF
    took = time.monotonic() - t0
    assert all(store.cached(h) is not None for h in handles)
    assert took < LONG_WAIT / 2, f"a read to the end took {took:.2f} s"
