"""SEND sequence numbers persisted in reserved blocks: one endpoint record per block of SENDs,
exact continuation after a clean close, no reuse after a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.send_lease import SEQUENCE_SPAN
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import receive_at_least


def endpoint_records(bootstrap: str, namespace: str, handle: str) -> list[bytes | None]:
    records = read_to_end(bootstrap, names.endpoints_topic(namespace), 15) or []
    return [m.value() for m in records if m.key() == handle.encode()]


def test_sends_write_one_endpoint_record_per_block_and_continue_exactly_after_close(kafka_bootstrap, namespace, broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(20):
        broker.send(h, CLAIM, {"i": i})
    with broker.transaction() as tx:
        for i in range(20, 25):
            tx.send(h, CLAIM, {"i": i})
    assert len(endpoint_records(kafka_bootstrap, namespace, h)) == 2  # BEGIN DIALOG, first SEND
    broker.close()  # a clean close writes the exact next sequence
    with Broker(kafka_bootstrap, namespace) as again:
        again.send(h, CLAIM, {"i": 25})
        seqs = [m.message_sequence_number for m in receive_at_least(again, "ExpenseQueue", 26)]
    assert seqs == list(range(26)), "a gap or a repeat after a clean close"


CHILD = textwrap.dedent("""
    import sys, time
    from kbroker.sdk.broker import Broker
    bootstrap, namespace, emp, exp, contract, claim = sys.argv[1:]
    broker = Broker(bootstrap, namespace)
    h = broker.begin_dialog(emp, exp, contract)
    for i in range(10):
        broker.send(h, claim, {"i": i})
    print(h, flush=True)
    time.sleep(600)
""")


def test_a_process_killed_within_a_block_never_has_its_sequences_reused(kafka_bootstrap, namespace, broker):
    """kill -9 after 10 SENDs, 9 of which left no endpoint record: another process waits for the
    dead one's lease to run out and goes on past everything that lease let it use (a gap, as
    after a crash, never a number used twice)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kafka_bootstrap, namespace, EMP, EXP, CONTRACT, CLAIM],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout is not None
        h = child.stdout.readline().strip()
    finally:
        child.kill()  # SIGKILL: no close(), no lease released
        child.wait(10)
    broker.send(h, CLAIM, {"i": 10})
    seqs = [m.message_sequence_number for m in receive_at_least(broker, "ExpenseQueue", 11)]
    assert seqs[:10] == list(range(10)) and seqs[10] == SEQUENCE_SPAN, seqs


def test_one_send_per_process_continues_exactly(kafka_bootstrap, namespace, broker):
    """Two processes in turn, each one SEND and a clean close (two `kbroker send` commands): the
    first SEND writes its state change with the block it reserved, and close() still releases the
    unused rest of that block. Before, the second SEND got sequence 65 (a gap of the whole block)."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"i": 0})
    broker.close()
    with Broker(kafka_bootstrap, namespace) as second:
        second.send(h, CLAIM, {"i": 1})
        seqs = [m.message_sequence_number for m in receive_at_least(second, "ExpenseQueue", 2)]
    assert seqs == [0, 1], f"a gap or a repeat between two processes' SENDs: {seqs}"
