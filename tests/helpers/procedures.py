"""Activation procedures the worker tests name in tests/data/worker.yaml. They run inside the
worker process; what they do is visible to the tests through Kafka (replies) or a file."""

from __future__ import annotations

import os
import time

DONE = "//kbroker/test/Done"


def slow_reader(broker, queue: str) -> None:
    """RECEIVE one message at a time, take KB_TEST_DELAY seconds over it, reply Done with its id
    (and the worker's pid) in the same transaction; return when a RECEIVE finds nothing for a
    second."""
    delay = float(os.environ.get("KB_TEST_DELAY", "0.2"))
    while True:
        with broker.transaction() as tx:
            msgs = tx.receive(queue, top=1, wait=1.0)
            if not msgs:
                return
            time.sleep(delay)
            for m in msgs:
                tx.send(
                    m.conversation_handle,
                    DONE,
                    {"job": m.message_id, "seq": m.message_sequence_number, "pid": os.getpid()},
                )


def stub(broker, queue: str) -> None:
    """Never RECEIVEs: seed 003's stub procedure. Notes each launch in KB_TEST_STUB_FILE."""
    with open(os.environ["KB_TEST_STUB_FILE"], "a") as f:
        f.write(f"{queue} {time.time()}\n")


def failing(broker, queue: str) -> None:
    """Raises at once, every launch: a procedure failure the worker records for its queue."""
    raise RuntimeError(f"a procedure of the tests failing on purpose on {queue}")
