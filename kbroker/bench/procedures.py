"""Activation procedures of the activation benchmarks (kbroker/bench/activation.py).

They run inside a `kbroker worker` started by the harness (as "kbroker.bench.procedures:<name>",
called `procedure(broker, queue)`), and the drain one also in the harness's own fixed pool of
reader threads, so both sides of activation-drain run the same code.

`first_receive` tells the harness when each activation's RECEIVEs returned rows: one JSON line per
non-empty RECEIVE, appended to the file named by $KBROKER_BENCH_ACTIVATION_LOG (set by the harness
on the worker it starts). One write() per line on a file opened with O_APPEND, so lines of
concurrent readers do not interleave.
"""

from __future__ import annotations

import os
import time
import uuid

import orjson

LOG_ENV = "KBROKER_BENCH_ACTIVATION_LOG"
LATENCY_WAIT = 0.5  # first_receive returns after a RECEIVE that waited this long and found nothing
DRAIN_WAIT = 1.0  # drain: the same, like the expenses sample's procedure
DRAIN_TOP = 100


def first_receive(broker, queue: str, wait: float = LATENCY_WAIT) -> int:
    """RECEIVE (top=100, each in its own transaction) until a RECEIVE finds nothing for `wait`
    seconds. Logs, per non-empty RECEIVE, when it returned (epoch ms, taken as soon as it
    returned, before the commit) and the conversation id and enqueued time of each message;
    `first` marks the activation's first RECEIVE that returned rows."""
    path = os.environ.get(LOG_ENV)
    activation = uuid.uuid4().hex[:12]
    first, handled = True, 0
    while True:
        with broker.transaction() as tx:
            msgs = tx.receive(queue, top=100, wait=wait)
            returned_ms = time.time() * 1000
        if not msgs:
            return handled
        handled += len(msgs)
        if path:
            line = (
                orjson.dumps(
                    {
                        "activation": activation,
                        "first": first,
                        "returned_ms": returned_ms,
                        "pid": os.getpid(),
                        "messages": [[m.conversation_id, m.enqueued_time] for m in msgs],
                    }
                )
                + b"\n"
            )
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        first = False


def drain(broker, queue: str, wait: float = DRAIN_WAIT, top: int = DRAIN_TOP, io_wait: float = 0.0) -> int:
    """An activated reader that only consumes: `RECEIVE TOP (100)` in a transaction of its own,
    committed, until a RECEIVE waits `wait` seconds and finds nothing. Returns messages taken.
    `io_wait`: seconds each message waits inside its transaction (an I/O-bound handler)."""
    handled = 0
    while True:
        with broker.transaction() as tx:
            msgs = tx.receive(queue, top=top, wait=wait)
            if io_wait:
                time.sleep(io_wait * len(msgs))
        if not msgs:
            return handled
        handled += len(msgs)


IO_WAIT = 0.005  # drain_io: each message's wait, an I/O-bound handler's call


def drain_io(broker, queue: str) -> int:
    """`drain` with an I/O-bound handler: TOP (10), each message waiting IO_WAIT seconds."""
    return drain(broker, queue, top=10, io_wait=IO_WAIT)
