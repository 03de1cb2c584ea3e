"""Savepoints (SAVE TRANSACTION / ROLLBACK TRANSACTION name) and SEND ON CONVERSATION (h1, h2,
...), against the real broker: what a rollback to a savepoint gives back and keeps, the typed
errors, asyncio, Service Broker's poison-message pattern end to end, and the invariant run with
readers that roll back to savepoints at random (tests/helpers/savepoint_runs.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from kbroker import errors
from kbroker.core import names
from kbroker.core.catalog.models import ERROR
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk import aio
from kbroker.sdk.broker import Broker
from tests.helpers import ROOT, receive_at_least, wait_for
from tests.helpers import invariants as inv
from tests.helpers.savepoint_runs import PoisonReader
from tests.integration.test_transactions import assert_invariants, stop_all, wait_for_all_replies

POISON_SERVER = "//kbroker/test/PoisonServer"


@pytest.fixture
def ns_broker(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.savepoint_runs", *args], cwd=ROOT)
    _STARTED.append(proc)
    return proc


def passes(log: Path) -> list[dict]:
    return inv.read_logs([log])


def seqs(msgs) -> list[int]:
    return [m.message_sequence_number for m in msgs]


def test_rollback_to_a_savepoint_gives_back_what_came_after_and_keeps_every_lock(
    kafka_bootstrap, namespace, ns_broker, tmp_path
):
    """RECEIVE, SEND, SAVE, RECEIVE more, SEND, BEGIN DIALOG, TIMER, END, ROLLBACK TO: the later
    messages come back in order to this transaction's next RECEIVE, the earlier stay held, what
    came after the savepoint is never written, and the group stays locked throughout: another
    transaction of the process and a RECEIVE loop in another process get nothing of it. The
    reply SENT after the rollback takes the number the undone one had: no gap."""
    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, POISON_SERVER, inv.CONTRACT)
    for i in range(6):
        b.send(h, inv.REQUEST, {"i": i})
    tx = b.transaction()
    first = tx.receive("PoisonQueue", top=2, wait=15)
    assert seqs(first) == [0, 1]
    group, target = first[0].conversation_group_id, first[0].conversation_handle
    tx.send(target, inv.REPLY, {"n": "before"})
    # Another process RECEIVEs from the queue meanwhile; its one partition stays with this
    # process (a sticky rebalance), so what keeps the group from it is this process's lock.
    stop, log = tmp_path / "stop", tmp_path / "watch.jsonl"
    watcher = start("watch", kafka_bootstrap, namespace, "PoisonQueue", str(stop), str(log))
    wait_for(lambda: passes(log), 60, "the other process to join the queue's group")
    time.sleep(6)  # its rebalance done: it RECEIVEs from now on

    tx.savepoint("sp")
    more = tx.receive("PoisonQueue", top=2, wait=5, conversation_group=group)
    assert seqs(more) == [2, 3]
    tx.send(target, inv.REPLY, {"n": "undone"})
    other = tx.begin_dialog(inv.CLIENT, POISON_SERVER, inv.CONTRACT)
    tx.send(other, inv.REQUEST, {"i": "undone"})
    tx.begin_conversation_timer(target, 1)
    tx.end_conversation(target)
    assert tx.endpoint(target).state_desc == "DISCONNECTED_OUTBOUND"
    tx.rollback_to("sp")

    assert tx.endpoint(target).state_desc == "CONVERSING" and tx.endpoint(target).send_sequence == 1
    with pytest.raises(errors.ConversationNotFoundError):
        tx.endpoint(other)
    with b.transaction() as rival:  # the group lock was never let go
        assert rival.receive("PoisonQueue", top=10, wait=1, conversation_group=group) == []
        assert rival.receive("PoisonQueue", top=10, wait=0.5) == []
    time.sleep(2)
    again = tx.receive("PoisonQueue", top=10, wait=5, conversation_group=group)
    assert seqs(again) == [2, 3, 4, 5]
    assert [m.message_id for m in again[:2]] == [m.message_id for m in more]
    tx.send(target, inv.REPLY, {"n": "after"})
    tx.commit()
    stop.touch()
    time.sleep(1)  # a RECEIVE that got something logs it at once
    watcher.kill()
    watcher.wait()
    assert watcher.returncode == -9, "the other process stopped by itself"
    assert [e for e in passes(log) if e["ids"]] == [], "another process received while the group was held"

    assert b.receive("PoisonQueue", top=10, wait=1) == []  # every request consumed once
    replies = receive_at_least(b, "ReplyQueue", 2)
    assert [orjson.loads(m.body)["n"] for m in replies] == ["before", "after"]
    assert seqs(replies) == [0, 1]  # the undone reply's number went to the next one
    assert b.receive("ReplyQueue", top=10, wait=1) == []  # no EndDialog: the END was undone
    assert b.endpoints.current(target).state_desc == "CONVERSING"
    assert (read_to_end(kafka_bootstrap, names.timers_topic(namespace), 30) or []) == []
    with pytest.raises(errors.ConversationNotFoundError):
        b.endpoints.current(other)


def test_savepoint_names_as_t_sql(ns_broker):
    """A repeated name goes to the latest of that name; savepoints after the one rolled back to
    are gone; an unknown name is error 6401 and changes nothing; a commit after rollback_to
    commits only what remains."""
    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    with b.transaction() as tx:
        tx.send(h, inv.REQUEST, {"i": 0})
        tx.savepoint("a")
        tx.send(h, inv.REQUEST, {"i": 1})
        tx.savepoint("b")
        tx.send(h, inv.REQUEST, {"i": "x"})
        tx.savepoint("a")  # the same name again
        tx.send(h, inv.REQUEST, {"i": "y"})
        tx.rollback_to("a")  # the latest "a": only "y" goes
        tx.rollback_to("b")  # "x" goes, and the second "a" with it
        with pytest.raises(errors.SavepointNotFoundError) as err:
            tx.rollback_to("c")
        assert err.value.code == 6401 and err.value.name == "c"
        tx.send(h, inv.REQUEST, {"i": 2})
        tx.rollback_to("a")  # the first "a": "i": 1 and 2 go; "b" is gone now
        with pytest.raises(errors.SavepointNotFoundError):
            tx.rollback_to("b")
        tx.send(h, inv.REQUEST, {"i": 1})
        with pytest.raises(errors.InvalidArgumentError):
            tx.savepoint("")
    got = receive_at_least(b, "RequestQueue", 2)
    assert [orjson.loads(m.body)["i"] for m in got] == [0, 1] and seqs(got) == [0, 1]
    assert b.receive("RequestQueue", top=10, wait=1) == []
    with pytest.raises(errors.TransactionStateError):
        tx.savepoint("late")
    with pytest.raises(errors.TransactionStateError):
        tx.rollback_to("a")


def test_a_receive_that_rolled_back_to_a_savepoint_before_it_is_no_poison_rollback(ns_broker):
    """Six rollbacks to a savepoint taken before the RECEIVE, each transaction committed: the
    message is handed out seven times and the queue (poison handling ON) stays enabled, where
    five whole rollbacks disable it."""
    b = ns_broker
    h = b.begin_dialog(inv.CLIENT, POISON_SERVER, inv.CONTRACT)
    b.send(h, inv.REQUEST, {"i": 0})
    for _ in range(6):
        with b.transaction() as tx:
            tx.savepoint("undo_receive")
            assert seqs(tx.receive("PoisonQueue", top=1, wait=15)) == [0]
            tx.rollback_to("undo_receive")
    assert b.runtime.queue_enabled("PoisonQueue")
    assert seqs(b.receive("PoisonQueue", top=1, wait=15)) == [0]


def test_send_on_several_conversations_is_all_or_none(ns_broker):
    b = ns_broker
    handles = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(3)]
    closed = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
    b.end_conversation(closed)
    assert b.endpoints.current(closed).state_desc == "CLOSED"  # it never sent: nothing to tell the target
    body = {"fan": "out", "pad": "x" * 1000}
    with b.transaction() as tx:
        ids = tx.send(handles, inv.REQUEST, body)
        held = tx._held.records  # the body made bytes once: every record carries the same object
        assert len(ids) == 3 and len(set(ids)) == 3
        assert len(held) == 3 and all(r[2] is held[0][2] for r in held)
        # One refused: none of this SEND is held, and the error names the handle.
        with pytest.raises(errors.ConversationClosedError) as err:
            tx.send([handles[0], closed, handles[2]], inv.REQUEST, {"fan": "never"})
        assert err.value.conversation_handle == closed and closed in str(err.value)
        assert len(tx._held.records) == 3
        with pytest.raises(errors.InvalidArgumentError):
            tx.send([handles[0], handles[0]], inv.REQUEST, body)
        with pytest.raises(errors.InvalidArgumentError):
            tx.send([], inv.REQUEST, body)
    got = receive_at_least(b, "RequestQueue", 3)
    assert sorted(m.message_id for m in got) == sorted(ids)
    assert len({m.conversation_id for m in got}) == 3 and all(orjson.loads(m.body) == body for m in got)
    # A type the target may not send, on one of the targets' handles: ContractViolationError naming it.
    targets = [m.conversation_handle for m in got]
    with b.transaction() as tx:
        with pytest.raises(errors.ContractViolationError) as err:
            tx.send([targets[0], handles[1]], inv.REPLY, {"r": 1})  # REPLY is the target's only
        assert err.value.conversation_handle == handles[1] and handles[1] in str(err.value)
        tx.send(targets, inv.REPLY, {"r": 2})
    # Outside a transaction: one transaction of its own; numbers go on with no gap.
    again = b.send(handles, inv.REQUEST, {"i": 2})
    assert len(again) == 3
    later = receive_at_least(b, "RequestQueue", 3)
    assert all(m.message_sequence_number == 1 for m in later)
    replies = receive_at_least(b, "ReplyQueue", 3)
    assert [orjson.loads(m.body) for m in replies] == [{"r": 2}] * 3 and seqs(replies) == [0, 0, 0]


def test_savepoints_and_several_conversations_in_asyncio(kafka_bootstrap, namespace, ns_broker):
    handles = [ns_broker.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(2)]
    for i in range(4):
        ns_broker.send(handles[0], inv.REQUEST, {"i": i})

    async def main():
        async with aio.AsyncBroker(Broker(kafka_bootstrap, namespace)) as broker:
            async with broker.transaction() as tx:
                first = await tx.receive("RequestQueue", top=1, wait=15)
                group = first[0].conversation_group_id
                await tx.savepoint("sp")
                more = await tx.receive("RequestQueue", top=2, wait=5, conversation_group=group)
                await tx.send(first[0].conversation_handle, inv.REPLY, {"n": "undone"})
                await tx.rollback_to("sp")
                with pytest.raises(errors.SavepointNotFoundError):
                    await tx.rollback_to("nope")
                again = await tx.receive("RequestQueue", top=10, wait=5, conversation_group=group)
                await tx.send(first[0].conversation_handle, inv.REPLY, {"n": "kept"})
            ids = await broker.send(handles, inv.REQUEST, {"both": True})
            return first, more, again, ids

    first, more, again, ids = asyncio.run(main())
    assert seqs(first) == [0] and seqs(more) == [1, 2] and seqs(again) == [1, 2, 3]
    assert len(ids) == 2
    replies = receive_at_least(ns_broker, "ReplyQueue", 1)
    assert [orjson.loads(m.body) for m in replies] == [{"n": "kept"}]
    assert len(receive_at_least(ns_broker, "RequestQueue", 2)) == 2


def test_the_poison_message_pattern_ends_the_conversation_and_never_disables_the_queue(
    kafka_bootstrap, namespace, ns_broker, tmp_path
):
    """Service Broker's pattern (tests/helpers/savepoint_runs.PoisonReader): RECEIVE, SAVE,
    process, and on failure ROLLBACK TO the savepoint, count the failure in the application's
    own table, and after N failures END CONVERSATION WITH ERROR and commit. Two readers, eight
    good conversations and one with a poison message third: the poison message is handed out
    N times (N = 6, past the five rollbacks that would disable the queue), its conversation
    ends with an error, the queue stays enabled, and every good message is answered exactly
    once, in order."""
    b = ns_broker
    threshold, per_conv = 6, 5
    good = [b.begin_dialog(inv.CLIENT, POISON_SERVER, inv.CONTRACT) for _ in range(8)]
    poisoned = b.begin_dialog(inv.CLIENT, POISON_SERVER, inv.CONTRACT)
    sent_ids: dict[str, list[str]] = {h: [] for h in good}
    for i in range(per_conv):
        for h in good:
            sent_ids[h].append(b.send(h, inv.REQUEST, {"i": i}))
        b.send(poisoned, inv.REQUEST, {"i": i, "poison": i == 2})
    reader = PoisonReader(b, "PoisonQueue", tmp_path / "failures.sqlite", threshold)
    errors_seen: list[BaseException] = []
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.is_set():
                reader.once(wait=0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors_seen.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    expected_replies = 8 * per_conv + 2  # the poisoned conversation's first two
    replies: list = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(replies) < expected_replies + 1:  # and its Error
        replies += b.receive("ReplyQueue", top=100, wait=1)
    time.sleep(2)  # anything more would be a duplicate
    replies += b.receive("ReplyQueue", top=100, wait=1)
    stop.set()
    for t in threads:
        t.join(30)
    assert errors_seen == []
    assert b.runtime.queue_enabled("PoisonQueue"), "the poison message disabled the queue"
    poison_conv = b.endpoints.current(poisoned).conversation_id
    assert reader.failures(poison_conv) == threshold and reader.ended == [poison_conv]
    assert reader.received.count((poison_conv, 2)) == threshold
    by_conv: dict[str, list] = {}
    for m in replies:
        by_conv.setdefault(m.conversation_handle, []).append(m)
    for h in good:
        got = by_conv.pop(h)
        assert [orjson.loads(m.body)["id"] for m in got] == sent_ids[h], f"{h}: not once each, in order"
    tail = by_conv.pop(poisoned)
    assert sorted(m.message_type_name for m in tail) == sorted([inv.REPLY, inv.REPLY, ERROR])
    assert [orjson.loads(m.body)["seq"] for m in tail if m.message_type_name == inv.REPLY] == [0, 1]
    assert by_conv == {}
    assert b.receive("PoisonQueue", top=10, wait=1) == []  # the rest of the poisoned dialog is discarded


def start_savepoint_reader(bootstrap, namespace, tmp: Path, name: str, readers: int, seed: int):
    stop, log = tmp / f"stop-{name}", tmp / f"log-{name}.jsonl"
    proc = start("reader", bootstrap, namespace, str(readers), str(stop), str(log), "0.05", "0.4", str(seed))
    return proc, stop, log


def test_invariants_with_readers_that_roll_back_to_savepoints(kafka_bootstrap, namespace, ns_broker, tmp_path):
    """600 conversations of 6 requests, 8 readers in 2 processes: each transaction RECEIVEs,
    then up to three times saves, RECEIVEs more of its group and, 40% of the time, SENDs decoy
    replies and rolls back to the savepoint (5% roll back whole). Committed replies read back
    from Kafka: 0 lost, 0 duplicated (a decoy that survived counts its messages twice), 0 out of
    order, 0 overlapping group holds, and every rollback to a savepoint handed its messages back
    first, in order."""
    per_conv = 6
    sent = inv.send_requests(ns_broker, 600, per_conv)
    a = start_savepoint_reader(kafka_bootstrap, namespace, tmp_path, "a", 4, 31)
    b = start_savepoint_reader(kafka_bootstrap, namespace, tmp_path, "b", 4, 32)
    replies = wait_for_all_replies(kafka_bootstrap, namespace, sent, 240, [a[0], b[0]])
    stop_all([a, b])
    logs = inv.read_logs([a[2], b[2]])
    report = inv.check(sent, replies, logs, per_conv)
    partial = sum(e["partial"] for e in logs)
    reordered = sum(e["reordered"] for e in logs)
    decoys = [r for r in replies if r.get("decoy")]
    print(
        f"\nsavepoint run: {len(logs)} commits, {partial} rollbacks to a savepoint, {reordered} handed back "
        f"out of order, {len(decoys)} decoys committed"
    )
    assert_invariants(report)
    assert reordered == 0 and decoys == []
    assert partial > 100, "too few rollbacks to a savepoint to say anything"
    assert len({e["pid"] for e in logs}) == 2, "both processes committed work"
