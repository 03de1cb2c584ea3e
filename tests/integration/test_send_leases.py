"""The conversation lock across processes (core/dialogs/send_lease.py): SENDs on one dialog from two
processes get one order, a process waits for another's open transaction, and a holder that
stopped is fenced, so its late commit is refused rather than landing after the new holder's.

Each Broker is a process as far as Kafka is concerned (its own clients, endpoint copy, leases
and transactional ids); the fencing test uses a real child process, stopped with SIGSTOP."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kbroker import errors
from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.envelope import H_SEQUENCE
from kbroker.core.dialogs.send_lease import LEASE_SECONDS, RENEW_WITHIN
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker


def sequences_in_log_order(bootstrap: str, namespace: str, conversation_handle_of: str | None = None) -> list[int]:
    """The sequence numbers of ExpenseQueue's records, in the order the log holds them."""
    records = read_to_end(bootstrap, names.queue_topic(namespace, "ExpenseQueue"), 15) or []
    return [int(dict(m.headers())[H_SEQUENCE]) for m in records]


def test_sends_on_one_dialog_from_two_processes_get_one_order(kafka_bootstrap, namespace, broker):
    """Two processes send in bursts on one dialog, autocommit and in transactions: the log holds
    their messages in sequence order with no gap. Before, each process numbered from a block of
    its own and the log held 5 before 64 before 6."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    other = Broker(kafka_bootstrap, namespace)
    failures: list[BaseException] = []

    def bursts(b: Broker, who: str) -> None:
        try:
            for burst in range(3):
                for i in range(4):
                    b.send(h, CLAIM, {"who": who, "burst": burst, "i": i})
                with b.transaction() as tx:
                    tx.send(h, CLAIM, {"who": who, "burst": burst, "tx": True})
                time.sleep(0.3)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    try:
        threads = [threading.Thread(target=bursts, args=(b, who)) for b, who in ((broker, "a"), (other, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        other.close()
    assert not failures, failures
    seqs = sequences_in_log_order(kafka_bootstrap, namespace)
    assert seqs == list(range(30)), f"not one order without gaps: {seqs}"


def test_a_process_waits_for_another_process_s_open_transaction(kafka_bootstrap, namespace, broker):
    """SEND locks the conversation until the transaction ends, across processes: a SEND from
    another process times out while the transaction is open and goes through after it ends,
    numbered after it. Before, the second process sent at once, from a block of its own."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"i": 0})
    with Broker(kafka_bootstrap, namespace, lock_timeout=2.0) as other:
        tx = broker.transaction()
        tx.send(h, CLAIM, {"i": 1})
        started = time.monotonic()
        with pytest.raises(errors.ConversationLockTimeoutError):
            other.send(h, CLAIM, {"i": "while locked"})
        assert time.monotonic() - started >= 1.9
        tx.commit()
        other.runtime.conversation_locks.timeout = 30.0
        other.send(h, CLAIM, {"i": 2})
    assert sequences_in_log_order(kafka_bootstrap, namespace) == [0, 1, 2]


def test_an_end_in_one_process_stops_a_send_from_another_with_a_stale_copy(kafka_bootstrap, namespace, broker):
    """A process whose copy of the endpoint predates another process's END CONVERSATION takes the
    lease before it SENDs, and the lease tells it the dialog ended: ConversationClosedError, and
    nothing reaches the target after the EndDialog. Before, the SEND went out."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"i": 0})
    with Broker(kafka_bootstrap, namespace) as stale:
        assert stale.endpoints.get(h).state == "CO"
        stale.endpoints.fresh_for = 3600  # it would not read the topic again by itself
        broker.end_conversation(h)
        with pytest.raises(errors.ConversationClosedError):
            stale.send(h, CLAIM, {"i": "late"})
    assert len(sequences_in_log_order(kafka_bootstrap, namespace)) == 2  # the claim and the EndDialog


CHILD = textwrap.dedent("""
    import sys
    from kbroker.sdk.broker import Broker
    from kbroker import errors
    bootstrap, namespace, emp, exp, contract, claim = sys.argv[1:]
    broker = Broker(bootstrap, namespace)
    h = broker.begin_dialog(emp, exp, contract)
    for i in range(3):
        broker.send(h, claim, {"i": i})
    tx = broker.transaction()
    tx.send(h, claim, {"i": "stale 1"})
    tx.send(h, claim, {"i": "stale 2"})
    print(h, flush=True)
    sys.stdin.readline()
    try:
        tx.commit()
        print("committed", flush=True)
    except errors.TransactionAbortedError:
        print("refused", flush=True)
    except errors.TransactionInDoubtError:  # fenced at commit: Kafka cannot say more
        print("in doubt", flush=True)
""")


def test_a_stopped_holder_is_fenced_and_its_late_commit_is_refused(kafka_bootstrap, namespace, broker):
    """A process holds the dialog's lease with a transaction open and stops (SIGSTOP: a long
    pause, a frozen VM). Once its lease runs out another process takes it over, fencing the
    stopped one's transactional ids, and SENDs. When the stopped process wakes and commits, the
    commit fails (aborted, or in doubt when the fence met it at commit): the log holds its three
    earlier messages, then the new holder's, and nothing of the stale transaction. Without the
    lease the second process sent at once and the stale transaction landed after it."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kafka_bootstrap, namespace, EMP, EXP, CONTRACT, CLAIM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        h = child.stdout.readline().strip()
        assert h, "the child did not start"
        os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        broker.send(h, CLAIM, {"i": "new holder"})
        waited = time.monotonic() - started
        assert 1.0 < waited < LEASE_SECONDS + 15, waited
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        outcome = child.stdout.readline().strip()
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(10)
    assert outcome in ("refused", "in doubt"), outcome
    seqs = sequences_in_log_order(kafka_bootstrap, namespace)
    assert seqs[:3] == [0, 1, 2] and len(seqs) == 4 and seqs[3] > 2, seqs


def test_a_busy_holder_lets_a_waiting_process_have_the_lease(kafka_bootstrap, namespace, broker):
    """One process sends on a dialog every 50 ms for 8 s, never idle for a second; another
    process's SEND gets the lease within a few seconds (it says it waits, and the holder lets the
    lease go between its statements), and the log keeps one order. Without the want, the second
    SEND waited until the first process stopped."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    stop = threading.Event()
    sent = [0]

    def busy() -> None:
        while not stop.is_set():
            broker.send(h, CLAIM, {"busy": sent[0]})
            sent[0] += 1
            time.sleep(0.05)

    t = threading.Thread(target=busy)
    t.start()
    try:
        time.sleep(1.0)
        with Broker(kafka_bootstrap, namespace) as other:
            started = time.monotonic()
            other.send(h, CLAIM, {"other": True})
            waited = time.monotonic() - started
    finally:
        stop.set()
        t.join(30)
    assert waited < 5.0, f"the waiting process got the lease after {waited:.1f} s"
    seqs = sequences_in_log_order(kafka_bootstrap, namespace)
    assert seqs == list(range(len(seqs))) and len(seqs) == sent[0] + 1, seqs


def test_a_dialog_left_idle_past_a_renewal_keeps_its_lease(broker):
    """A dialog the application comes back to after a pause longer than a renewal period finds its
    lease still held (the keeper renewed it): its next SEND claims nothing. With leases released
    after 5 s idle, a round over many dialogs slower than that claimed every lease again."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 1})
    store = broker.runtime.endpoints
    store.refresh()
    first = store.lease(h)
    assert first is not None and first.owner == broker.runtime.process
    time.sleep(LEASE_SECONDS - RENEW_WITHIN + 2.0)  # past the first renewal, and past the old release
    started = time.monotonic()
    broker.send(h, CLAIM, {"n": 2})
    took = time.monotonic() - started
    store.refresh()
    now = store.lease(h)
    assert now is not None and now.epoch == first.epoch and now.owner == first.owner, (first, now)
    assert now.until > first.until  # renewed, not claimed again
    print(f"SEND after {LEASE_SECONDS - RENEW_WITHIN + 2.0:g} s idle took {took * 1000:.1f} ms")


def test_a_renewal_holds_no_conversation_lock(broker, monkeypatch):
    """The keeper renews a lease without locking its conversation, so a SEND on it does not wait
    for the renewal's write and read back. It used to lock every held lease for its whole pass:
    every SEND of a busy process stalled behind the renewals every few seconds."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 1})
    leases, locks = broker.runtime.send_leases, broker.runtime.conversation_locks
    with leases._mutex:  # due for renewal (under RENEW_WITHIN left), still usable
        leases._held[h] = dataclasses.replace(leases._held[h], until=time.time() + RENEW_WITHIN - 1)
    renewing, go = threading.Event(), threading.Event()
    renew = leases._renew_now

    def slow_renewal(due):
        renewing.set()
        go.wait(10)
        return renew(due)

    monkeypatch.setattr(leases, "_renew_now", slow_renewal)
    keeper = threading.Thread(target=leases.keep)
    keeper.start()
    try:
        assert renewing.wait(10), "the keeper did not renew a lease due for renewal"
        me = object()
        assert locks.try_lock(h, me), "the keeper holds the conversation while it renews"
        locks.release([h], me)
    finally:
        go.set()
        keeper.join(15)
    assert leases._held[h].until > time.time() + RENEW_WITHIN  # renewed all the same
    broker.send(h, CLAIM, {"n": 2})


ENDED = 40_000  # dialogs ended an hour ago on the endpoints topic: 80,000 records, ~20x the read-ahead


def test_a_send_beside_many_ended_dialogs_reads_the_endpoints_topic_at_fetch_speed(
    kafka_bootstrap, namespace, broker, caplog
):
    """A process's first lease claim reads the whole endpoints topic. Its consumer reads ahead
    4 MiB; librdkafka waited 1 s after each time that filled before fetching again, so the read
    ran at a few MB/s: a SEND beside 40,000 ended dialogs took about 9 s (1,000,000 of them
    failed the SEND: "the claim ... was not read back"), and its lease renewal, short of its own
    record, logged the lease as taken over."""
    from kbroker.bench.scenarios.endpoints import write_ended

    write_ended(kafka_bootstrap, namespace, ENDED)
    fresh = Broker(kafka_bootstrap, namespace)  # a process that has read none of it
    try:
        h = fresh.begin_dialog(EMP, EXP, CONTRACT)
        started = time.monotonic()
        fresh.send(h, CLAIM, {"n": 1})
        took = time.monotonic() - started
        assert fresh.runtime.endpoints.get(h) is not None
    finally:
        fresh.close()
    print(f"SEND beside {ENDED:,} ended dialogs: {took:.2f} s")
    assert took < 4.0, f"the SEND took {took:.1f} s"
    assert "taken over" not in caplog.text
