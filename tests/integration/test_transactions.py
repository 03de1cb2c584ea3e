"""Transactions, group locks, poison messages, and the G1/G2 invariants over multi-process runs
with rebalances and kill -9, all against the real broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from kbroker import errors
from kbroker.core import names
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import ROOT, receive_at_least, wait_for
from tests.helpers import invariants as inv


@pytest.fixture
def ns_broker(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


def visible_replies(bootstrap, namespace):
    return inv.read_replies(bootstrap, names.queue_topic(namespace, "ReplyQueue"))


def test_commit_publishes_sends_and_rollback_hides_them(kafka_bootstrap, namespace, ns_broker):
    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    for i in range(3):
        b.send(h, inv.REQUEST, {"i": i})
    # Roll back: the reply is never visible, the messages come back in order.
    with pytest.raises(RuntimeError):
        with b.transaction() as tx:
            got = tx.receive("RequestQueue", top=2, wait=15)
            assert [m.message_sequence_number for m in got] == [0, 1]
            tx.send(got[0].conversation_handle, inv.REPLY, {"aborted": True})
            raise RuntimeError("handler failed")
    with b.transaction() as tx:
        got = tx.receive("RequestQueue", top=10, wait=15)
        assert [m.message_sequence_number for m in got] == [0, 1, 2]
        tx.send(got[0].conversation_handle, inv.REPLY, {"aborted": False})
    assert b.receive("RequestQueue", top=10, wait=0) == []
    assert visible_replies(kafka_bootstrap, namespace) == [{"aborted": False}]
    with pytest.raises(errors.TransactionStateError):
        tx.send(got[0].conversation_handle, inv.REPLY, {})


def test_group_lock_within_a_process(ns_broker):
    b = ns_broker
    handles = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(2)]
    for h in handles:
        b.send(h, inv.REQUEST, {})
    tx1, tx2 = b.transaction(), b.transaction()
    first = tx1.receive("RequestQueue", wait=15)
    second = tx2.receive("RequestQueue", wait=15)
    assert first and second
    assert first[0].conversation_group_id != second[0].conversation_group_id
    # A third reader finds nothing: both groups are locked, nothing else is ready.
    with b.transaction() as tx3:
        assert tx3.receive("RequestQueue", wait=0.5) == []
    tx1.rollback()
    with b.transaction() as tx4:
        again = tx4.receive("RequestQueue", wait=15)
        assert [m.message_id for m in again] == [m.message_id for m in first]
    tx2.commit()


def send_poison(b: Broker) -> None:
    b.send(b.begin_dialog(inv.CLIENT, "//kbroker/test/PoisonServer", inv.CONTRACT), inv.REQUEST, {"poison": True})


def roll_back_receives(b: Broker, times: int, wait: float = 15) -> None:
    """`times` transactions that each RECEIVE from PoisonQueue and roll back."""
    for attempt in range(times):
        tx = b.transaction()
        assert tx.receive("PoisonQueue", wait=wait), f"attempt {attempt}: message missing"
        tx.rollback()


def poison_events(bootstrap: str, namespace: str) -> list[dict]:
    return [
        e
        for e in inv.read_replies(bootstrap, names.events_topic(namespace))
        if e["event"] == "QUEUE_DISABLED" and e["queue"] == "PoisonQueue" and e["poison"]
    ]


def test_poison_messages_disable_the_queue_and_enable_resumes(kafka_bootstrap, namespace, ns_broker):
    from kbroker.kafka.queue_views import set_queue_status

    b = ns_broker
    send_poison(b)
    roll_back_receives(b, 5)
    with pytest.raises(errors.QueueDisabledError, match="PoisonQueue"):
        b.receive("PoisonQueue", wait=0)
    assert poison_events(kafka_bootstrap, namespace)
    set_queue_status(kafka_bootstrap, namespace, "PoisonQueue", "ON", "fixed the handler")
    msgs = b.receive("PoisonQueue", wait=15)
    assert [orjson.loads(m.body) for m in msgs] == [{"poison": True}]  # the message was kept


def test_garbage_on_the_events_topic_stops_no_reader_and_disables_nothing(kafka_bootstrap, namespace, ns_broker):
    """The events topic, which every reading process follows for rollback counts and poison
    verdicts, may hold anything another client wrote: records that only look like a queue's
    status or a rollback are read past, the queue stays enabled and its message is served."""
    from kbroker.kafka.catalog.catalog_store import read_catalog, write_records

    b = ns_broker
    send_poison(b)
    garbage = {
        "PoisonQueue": b'"QUEUE_DISABLED" not json \xff',
        "x1": b'["QUEUE_DISABLED", "PoisonQueue"]',
        "x2": orjson.dumps({"event": "QUEUE_DISABLED", "queue": ["PoisonQueue"], "poison": True, "catalog": False}),
        "x3": b'{"event": "RECEIVE_ROLLED_BACK", "messages": "all"}',
        "x4": b'{"event": "RECEIVE_ROLLED_BACK", "topic": 1, "messages": [[0, 0, "five"]]}',
    }
    write_records(kafka_bootstrap, names.events_topic(namespace), garbage, 10.0)
    with b.transaction() as tx:  # the first RECEIVE starts the follower, which reads them first
        msgs = tx.receive("PoisonQueue", wait=15)
    assert [orjson.loads(m.body) for m in msgs] == [{"poison": True}]
    assert b.runtime._rollbacks is not None and b.runtime._rollbacks._thread.is_alive()  # still following
    assert read_catalog(kafka_bootstrap, namespace).queue("PoisonQueue").status == "ON"


def test_a_poison_message_counts_its_rollbacks_across_processes(kafka_bootstrap, namespace, ns_broker):
    """Three rollbacks in one process, then the message moves to another (the first one
    stopped): its fifth rollback, the other's second, disables the queue. Before, each process
    counted its own, and the second one's count began at 0."""
    send_poison(ns_broker)
    roll_back_receives(ns_broker, 3)
    ns_broker.close()  # its partition goes to the next reader
    with Broker(kafka_bootstrap, namespace) as other:
        roll_back_receives(other, 2, wait=30)
        with pytest.raises(errors.QueueDisabledError, match="PoisonQueue"):
            other.receive("PoisonQueue", wait=0)
    reasons = [e["reason"] for e in poison_events(kafka_bootstrap, namespace)]
    assert len(reasons) == 1 and "rolled back 5 times" in reasons[0], reasons


def test_a_poison_message_disables_the_queue_while_other_messages_commit(kafka_bootstrap, namespace, ns_broker):
    """Readers that commit other messages between the poison message's rollbacks reset the
    per-process count of rollbacks in a row; the message's own count still reaches five.
    Before, the queue stayed enabled and the message was retried for ever."""
    b = ns_broker
    send_poison(b)
    for i in range(10):
        b.send(b.begin_dialog(inv.CLIENT, "//kbroker/test/PoisonServer", inv.CONTRACT), inv.REQUEST, {"good": i})
    for attempt in range(5):
        # Two readers: one takes the poison message, the other a good one and commits first.
        holder, worker = b.transaction(), b.transaction()
        taken = holder.receive("PoisonQueue", wait=15)
        assert taken and orjson.loads(taken[0].body) == {"poison": True}, f"attempt {attempt}: {taken}"
        assert worker.receive("PoisonQueue", wait=15), f"attempt {attempt}: no good message"
        worker.commit()
        holder.rollback()
    with pytest.raises(errors.QueueDisabledError, match="PoisonQueue"):
        b.receive("PoisonQueue", wait=0)
    assert len(poison_events(kafka_bootstrap, namespace)) == 1


def test_poison_handling_off_never_disables(ns_broker):
    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    b.send(h, inv.REQUEST, {})
    for _ in range(7):
        tx = b.transaction()
        assert tx.receive("RequestQueue", wait=15)
        tx.rollback()
    assert len(b.receive("RequestQueue", wait=15)) == 1


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_reader_outlives_its_test():
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_reader(bootstrap, namespace, tmp: Path, name: str, readers: int, rate: float, seed: int):
    stop = tmp / f"stop-{name}"
    log = tmp / f"log-{name}.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.invariants",
            "reader",
            bootstrap,
            namespace,
            str(readers),
            str(stop),
            str(log),
            str(rate),
            str(seed),
        ],
        cwd=ROOT,
    )
    _STARTED.append(proc)
    return proc, stop, log


def wait_for_all_replies(bootstrap, namespace, sent, deadline_s, procs):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        replies = visible_replies(bootstrap, namespace)
        if sum(len(r["ids"]) for r in replies) >= len(sent):
            return replies
        for p in procs:
            assert p.poll() in (None, -signal.SIGKILL), f"a reader process exited with {p.returncode}"
        time.sleep(1)
    return visible_replies(bootstrap, namespace)


def stop_all(procs_stops):
    for _proc, stop, _ in procs_stops:
        stop.touch()
    for proc, _, _ in procs_stops:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def assert_invariants(report: inv.Report):
    summary = (
        f"sent={report.sent} committed_tx={report.committed} lost={len(report.lost)} "
        f"duplicated={len(report.duplicated)} order={len(report.order_violations)} "
        f"lock={len(report.lock_violations)} unknown={len(report.unknown)}"
    )
    print(summary)
    assert report.ok(), (
        summary + f"\n{report.lost[:3]} {report.duplicated[:3]} "
        f"{report.order_violations[:3]} {report.lock_violations[:3]}"
    )


def test_invariants_with_rebalances(kafka_bootstrap, namespace, ns_broker, tmp_path):
    """1,000 conversations, 8 readers in 2 processes, random rollbacks, a third process joining
    and leaving mid-run: zero lock, order, loss and duplicate violations."""
    per_conv = 4
    sent = inv.send_requests(ns_broker, 1000, per_conv)
    a = start_reader(kafka_bootstrap, namespace, tmp_path, "a", 4, 0.1, 1)
    b = start_reader(kafka_bootstrap, namespace, tmp_path, "b", 4, 0.1, 2)
    time.sleep(3)
    c = start_reader(kafka_bootstrap, namespace, tmp_path, "c", 4, 0.1, 3)
    deadline = time.monotonic() + 90
    while len(inv.read_logs([c[2]])) < 10:  # C joined and took part before it leaves
        assert time.monotonic() < deadline, "reader C never got going"
        time.sleep(0.05)
    stop_all([c])  # leaves cleanly: its partitions move back
    replies = wait_for_all_replies(kafka_bootstrap, namespace, sent, 180, [a[0], b[0]])
    stop_all([a, b])
    logs = inv.read_logs([a[2], b[2], c[2]])
    assert len({e["pid"] for e in logs}) == 3, "every process committed some work"
    assert_invariants(inv.check(sent, replies, logs, per_conv))


def test_kill_9_mid_transaction_loses_and_duplicates_nothing(kafka_bootstrap, namespace, ns_broker, tmp_path):
    """kill -9 a receiving process mid-run: every committed message was received once, every
    uncommitted one is received again (by the survivor), and nothing an aborted transaction
    sent is visible. The server's queue is RETENTION = ON (ALTER QUEUE before the run) and a
    broker priority covers every dialog: each committed reply has exactly one retained copy in
    the server's queue (status 3), none of an aborted one, and no copy is ever received."""
    kept = tmp_path / "retained.yaml"
    kept.write_text(
        inv.YAML.read_text().replace(
            "    poison_message_handling: OFF\n", "    poison_message_handling: OFF\n    retention: ON\n"
        )
        + "broker_priorities:\n  - {name: Everyone, priority: 7}\n"
    )
    assert "retention: ON" in kept.read_text()
    apply_paths(kafka_bootstrap, namespace, [kept])
    per_conv = 3
    sent = inv.send_requests(ns_broker, 600, per_conv)
    a = start_reader(kafka_bootstrap, namespace, tmp_path, "a", 4, 0.05, 11)
    b = start_reader(kafka_bootstrap, namespace, tmp_path, "b", 4, 0.05, 12)
    # Kill B once it is demonstrably mid-run: it has committed some work and has more to do.
    deadline = time.monotonic() + 90
    while len(inv.read_logs([b[2]])) < 20:
        assert time.monotonic() < deadline, "reader B never got going"
        assert b[0].poll() is None, f"reader B exited with {b[0].returncode}"
        time.sleep(0.05)
    os.kill(b[0].pid, signal.SIGKILL)
    b[0].wait()
    replies = wait_for_all_replies(kafka_bootstrap, namespace, sent, 180, [a[0]])
    stop_all([a])
    logs = inv.read_logs([a[2], b[2]])
    assert {e["pid"] for e in logs} == {a[0].pid, b[0].pid}, "both processes committed work"
    assert_invariants(inv.check(sent, replies, logs, per_conv))
    reply_records = read_to_end(kafka_bootstrap, names.queue_topic(namespace, "ReplyQueue"), 30) or []
    assert {dict(r.headers())["kb.priority"] for r in reply_records} == {b"7"}
    rows = ns_broker.queue_messages("RequestQueue")
    copies = Counter(r["message_id"] for r in rows if r["status"] == 3)
    reply_ids = Counter(dict(r.headers())["kb.message_id"].decode() for r in reply_records)
    received = Counter(r["message_id"] for r in rows if r["status"] == 0)
    print(f"retained: {sum(copies.values())} sent copies for {len(reply_records)} replies, {len(received)} received")
    assert copies == reply_ids and set(received) == sent and set(received.values()) == {1}
    assert {r["priority"] for r in rows} == {7}


def test_invariants_while_the_queue_is_disabled_and_enabled_and_a_reader_is_killed(
    kafka_bootstrap, namespace, ns_broker, tmp_path
):
    """Two reader processes; the test process turns RequestQueue OFF and ON again three times
    while they read, and kill -9s one of them. Nothing is lost, duplicated, out of order or held
    by two at once, and no transaction takes a message later than 3 s after the queue went OFF
    (it used to go on for many seconds: the status was seen on the next catalog error). In the
    first OFF window an apply alters the requests' message type from JSON to WELL_FORMED_XML: the
    queue stays OFF (the file names no status) and the JSON requests queued before are spared
    (none refused on arrival, so none lost)."""
    from kbroker.kafka.queue_views import set_queue_status

    altered = tmp_path / "altered.yaml"
    altered.write_text(
        inv.YAML.read_text().replace(
            f"  - name: {inv.REQUEST}\n    validation: JSON\n",
            f"  - name: {inv.REQUEST}\n    validation: WELL_FORMED_XML\n",
        )
    )
    assert "WELL_FORMED_XML" in altered.read_text()
    per_conv = 3
    sent = inv.send_requests(ns_broker, 600, per_conv)
    a = start_reader(kafka_bootstrap, namespace, tmp_path, "a", 4, 0.05, 21)
    b = start_reader(kafka_bootstrap, namespace, tmp_path, "b", 4, 0.05, 22)
    wait_for(lambda: len(inv.read_logs([a[2], b[2]])) >= 20, 90, "the readers to get going")
    off_windows = []
    for cycle in range(3):
        set_queue_status(kafka_bootstrap, namespace, "RequestQueue", "OFF", f"test cycle {cycle}")
        off_at = time.time()
        if cycle == 0:  # ALTER MESSAGE TYPE mid-run; the queue stays OFF (its file names no status)
            apply_paths(kafka_bootstrap, namespace, [altered])
            ns_broker.refresh_catalog()
            assert ns_broker.catalog.queue("RequestQueue").status == "OFF"
            with pytest.raises(errors.MessageValidationError):  # in force: a JSON request is refused now
                ns_broker.send(ns_broker.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT), inv.REQUEST, {"late": 1})
        time.sleep(4.0)
        if cycle == 1:
            os.kill(b[0].pid, signal.SIGKILL)
            b[0].wait()
        on_at = time.time()
        set_queue_status(kafka_bootstrap, namespace, "RequestQueue", "ON", f"test cycle {cycle}")
        off_windows.append((off_at, on_at))
        time.sleep(1.5)
    replies = wait_for_all_replies(kafka_bootstrap, namespace, sent, 180, [a[0]])
    stop_all([a])
    logs = inv.read_logs([a[2], b[2]])
    after_off = [e["leased"] - off_at for e in logs for off_at, on_at in off_windows if off_at < e["leased"] < on_at]
    for i, (off_at, on_at) in enumerate(off_windows):
        inside = [(e["pid"], round(e["leased"] - off_at, 2)) for e in logs if off_at < e["leased"] < on_at]
        print(
            f"\nwindow {i}: {len(inside)} taken, last per pid "
            f"{ {pid: max(d for p2, d in inside if p2 == pid) for pid, _ in inside} }"
        )
    print(
        f"\nlast message taken {max(after_off, default=0):.2f} s after a queue went OFF "
        f"({len(after_off)} transactions took messages in the windows)"
    )
    # The target is 1 s (the catalog watcher looks every 0.5 s; 0.52-0.55 s measured on an idle
    # machine). Asserted: 3 s, which a CI machine at a load average of 20 on 2 cores still keeps.
    late = [d for d in after_off if d > 3.0]
    assert late == [], f"{len(late)} transactions received while the queue was OFF, up to {max(late):.1f} s after"
    assert_invariants(inv.check(sent, replies, logs, per_conv))
    dead = read_to_end(kafka_bootstrap, names.deadletter_topic(namespace), 30) or []
    assert dead == [], f"{len(dead)} messages dead-lettered, the first: {dict(dead[0].headers())}"


def test_asyncio_api_many_readers_on_one_event_loop(kafka_bootstrap, namespace, ns_broker):
    """async with transactions: 20 coroutines receive different groups concurrently; each
    reply commits with its receive."""
    import asyncio

    from kbroker.sdk import aio

    handles = [ns_broker.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(20)]
    for h in handles:
        ns_broker.send(h, inv.REQUEST, {"h": h})

    async def main():
        broker = aio.AsyncBroker(Broker(kafka_bootstrap, namespace))
        handled = []

        async def reader():
            while True:
                async with broker.transaction() as tx:
                    msgs = await tx.receive("RequestQueue", top=5, wait=2)
                    if not msgs:
                        return
                    await asyncio.sleep(0.05)  # I/O-bound work: other readers proceed meanwhile
                    await tx.send(msgs[0].conversation_handle, inv.REPLY, {"ids": [m.message_id for m in msgs]})
                    handled.extend(m.message_id for m in msgs)

        async with broker:
            await asyncio.gather(*(reader() for _ in range(8)))
        return handled

    handled = asyncio.run(main())
    assert len(handled) == 20 and len(set(handled)) == 20
    assert sum(len(r["ids"]) for r in visible_replies(kafka_bootstrap, namespace)) == 20


def test_send_locks_the_conversation_until_the_transaction_ends(ns_broker):
    # Two transactions sending on one dialog must not both number from the same send sequence:
    # the second waits for the first to end, then continues its sequence.
    import threading

    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    first = b.transaction()
    first.send(h, inv.REQUEST, {"i": 0})
    second_done = threading.Event()

    def second() -> None:
        with b.transaction() as tx:
            tx.send(h, inv.REQUEST, {"i": 1})
        second_done.set()

    t = threading.Thread(target=second)
    t.start()
    assert not second_done.wait(1.0), "the second SEND did not wait for the conversation lock"
    first.commit()
    assert second_done.wait(30)
    t.join()
    got = receive_at_least(b, "RequestQueue", 2)
    assert [m.message_sequence_number for m in got] == [0, 1]
    assert [orjson.loads(m.body)["i"] for m in got] == [0, 1]


def test_a_conversation_locked_too_long_raises_a_retriable_error(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=0.5)
    try:
        h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
        holder = b.transaction()
        holder.send(h, inv.REQUEST, {"i": 0})
        with pytest.raises(errors.ConversationLockTimeoutError) as err:
            b.send(h, inv.REQUEST, {"i": 1})
        assert err.value.retriable and err.value.handle == h
        holder.rollback()
        b.send(h, inv.REQUEST, {"i": 2})  # free again once the holder ended
        got = b.receive("RequestQueue", top=10, wait=15)
        assert [orjson.loads(m.body)["i"] for m in got] == [2]
    finally:
        b.close()


def test_a_lock_time_out_shorter_than_a_round_trip_to_kafka_waits_only_for_other_transactions(
    kafka_bootstrap, namespace
):
    # The time-out bounds waiting for another transaction's lock, not Kafka: a group no one
    # holds is taken on the holds topic however long that takes (here longer than 1 ms).
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=0.001)
    try:
        handles = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(3)]
        for i, h in enumerate(handles):
            b.send(h, inv.REQUEST, {"i": i})  # the first on each is a fresh group's: no hold
            b.send(h, inv.REQUEST, {"i": 10 + i})  # a hold on the holds topic
        got = receive_at_least(b, "RequestQueue", 6)
        assert sorted(orjson.loads(m.body)["i"] for m in got) == [0, 1, 2, 10, 11, 12]
    finally:
        b.close()
