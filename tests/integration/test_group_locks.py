"""The conversation group lock of the statements that touch a conversation (core/dialogs/group_lock.py):
SEND, END CONVERSATION, BEGIN CONVERSATION TIMER, MOVE and BEGIN DIALOG in a related group lock
the group of this side's endpoint until the transaction ends, the lock RECEIVE and GET
CONVERSATION GROUP take, against the real broker. Threads of one process here; across processes
test_group_holds.py runs the same race (docs/sdk.md, Locks)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import pytest

from kbroker import errors
from kbroker.core.dialogs.group_lock import ConversationGroupLockTimeoutError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from kbroker.sdk.group_locks import GroupLocks
from tests.helpers import invariants as inv


@pytest.fixture
def ns_broker(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=20.0)
    yield b
    b.close()


def dialogs_in_one_group(b: Broker, n: int) -> tuple[str, list[str]]:
    """n dialogs whose initiator side (ReplyQueue) is one conversation group."""
    g = str(uuid.uuid4())
    return g, [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT, related_conversation_group=g) for _ in range(n)]


def seeded_groups(b: Broker, groups: int, per_group: int) -> list[tuple[str, list[str]]]:
    """`groups` conversation groups of `per_group` dialogs each, every dialog sent one request
    (so the replier gives each group something to RECEIVE)."""
    made = [dialogs_in_one_group(b, per_group) for _ in range(groups)]
    for _, handles in made:
        for h in handles:
            b.send(h, inv.REQUEST, {"seed": True})
    return made


def reply_to_every_request(b: Broker, stop: threading.Event) -> threading.Thread:
    """The target side: each request gets a reply, so the initiator's group has messages to RECEIVE."""

    def loop() -> None:
        while not stop.is_set():
            with b.transaction() as tx:
                for m in tx.receive("RequestQueue", top=10, wait=0.5):
                    tx.send(m.conversation_handle, inv.REPLY, {"seq": m.message_sequence_number})

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def hold_and_reply(tx, rng: random.Random, alone: float = 0.0) -> tuple[str, float, bool] | None:
    """A holder's statements in `tx`: GET CONVERSATION GROUP on ReplyQueue, then (but for the
    share `alone` of the time: the lock alone) RECEIVE from the group and SEND a request on its
    first message's conversation, with a little work in between. The group, when its lock was
    taken, and whether the statements past the lock ran; None when no group was ready."""
    g = tx.get_conversation_group("ReplyQueue", wait=0.5)
    start = time.monotonic()
    if g is None:
        return None
    if alone and rng.random() < alone:  # no RECEIVE: no poison count when it is rolled back
        time.sleep(rng.uniform(0, 0.03))
        return g, start, False
    msgs = tx.receive("ReplyQueue", top=5, conversation_group=g)
    time.sleep(rng.uniform(0, 0.03))
    if msgs:
        tx.send(msgs[0].conversation_handle, inv.REQUEST, {"from": "holder"})
    return g, start, True


def test_a_send_waits_for_the_group_a_get_conversation_group_holds(ns_broker):
    b = ns_broker
    g, (h1, h2) = dialogs_in_one_group(b, 2)
    b.send(h1, inv.REQUEST, {"i": 0})
    with b.transaction() as tx:  # a reply into the group
        m = tx.receive("RequestQueue", wait=15)[0]
        tx.send(m.conversation_handle, inv.REPLY, {})
    holder = b.transaction()
    assert holder.get_conversation_group("ReplyQueue", wait=15) == g
    done = threading.Event()

    def send_only() -> None:
        with b.transaction() as tx:
            tx.send(h2, inv.REQUEST, {"i": 1})  # the other conversation of the group
        done.set()

    t = threading.Thread(target=send_only)
    t.start()
    assert not done.wait(1.5), "a SEND on a conversation of a held group did not wait for it"
    holder.send(h1, inv.REQUEST, {"i": 2})  # re-entrant: the holder's own group
    holder.commit()
    assert done.wait(30)
    t.join()
    # ... and the other way round: the sender's group lock keeps RECEIVE off the group.
    sender = b.transaction()
    sender.send(h2, inv.REQUEST, {"i": 3})
    with b.transaction() as tx:
        assert tx.get_conversation_group("ReplyQueue", wait=1.0) is None
    sender.rollback()
    with b.transaction() as tx:
        assert tx.get_conversation_group("ReplyQueue", wait=15) == g


@pytest.mark.parametrize("same", [False, True], ids=["another transaction", "the same transaction"])
def test_a_group_locked_before_this_process_reads_its_queue_stays_locked_once_it_does(kafka_bootstrap, namespace, same):
    """A SEND locks its group by name while no receiver of the group's queue runs here; a GET
    CONVERSATION GROUP then starts one. The group waits for the SEND's transaction (another
    transaction gets it only after that one ends), and is that transaction's own to receive."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    with Broker(kafka_bootstrap, namespace) as seeder:  # a reply waiting in the group, from elsewhere
        g, (h1, h2) = dialogs_in_one_group(seeder, 2)
        seeder.send(h1, inv.REQUEST, {"i": 0})
        with seeder.transaction() as tx:
            m = tx.receive("RequestQueue", wait=15)[0]
            tx.send(m.conversation_handle, inv.REPLY, {})
    b = Broker(kafka_bootstrap, namespace, lock_timeout=20.0)
    try:
        sender = b.transaction()
        sender.send(h2, inv.REQUEST, {"i": 1})
        assert ("ReplyQueue", None) not in b.runtime.receivers()  # locked by name
        if same:
            assert sender.get_conversation_group("ReplyQueue", wait=15) == g
            assert [m.conversation_handle for m in sender.receive("ReplyQueue", conversation_group=g)] == [h1]
            sender.commit()
            return
        with b.transaction() as other:
            assert other.get_conversation_group("ReplyQueue", wait=4) is None  # it starts the receiver
        sender.commit()
        with b.transaction() as other:
            assert other.get_conversation_group("ReplyQueue", wait=15) == g
    finally:
        b.close()


@pytest.mark.parametrize("receiving", [False, True], ids=["no receiver here", "receiver here"])
def test_opposite_order_ends_in_a_typed_error_not_a_hang(kafka_bootstrap, namespace, receiving):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=1.0)
    try:
        if receiving:
            b.receive("ReplyQueue", wait=0)  # the group locks are then the receiver's
        a, b_ = (
            b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT),
            b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT),
        )
        tx1, tx2 = b.transaction(), b.transaction()
        tx1.send(a, inv.REQUEST, {})
        tx2.send(b_, inv.REQUEST, {})
        failed: list[BaseException] = []

        def cross(tx, handle) -> None:
            try:
                tx.send(handle, inv.REQUEST, {})
            except errors.ConversationLockTimeoutError as exc:
                failed.append(exc)

        started = time.monotonic()
        threads = [threading.Thread(target=cross, args=(tx1, b_)), threading.Thread(target=cross, args=(tx2, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert time.monotonic() - started < 10
        assert failed and all(isinstance(e, ConversationGroupLockTimeoutError) for e in failed)
        assert all(e.retriable and e.number == 1205 and e.handle in (a, b_) for e in failed)
        tx1.rollback()
        tx2.rollback()
        b.send(a, inv.REQUEST, {})  # free again
    finally:
        b.close()


def race(b: Broker, seconds: float) -> tuple[dict[str, int], list[str], list[BaseException]]:
    """2 holders (GET CONVERSATION GROUP, RECEIVE, SEND, COMMIT; or the lock alone, rolled back)
    and 2 send-only transactions on the conversations of 2 groups, threads of one process, for
    `seconds`: how many transactions of each, the overlapping holds, the threads' errors."""
    groups = seeded_groups(b, 2, 3)
    stop = threading.Event()
    holds: list[dict] = []
    lock = threading.Lock()
    counts = {"holder": 0, "sender": 0}
    failures: list[BaseException] = []

    def guarded(run) -> Any:
        def go(idx: int) -> None:
            try:
                run(idx)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)
                stop.set()

        return go

    def note(group: str, start: float, who: str) -> None:
        with lock:
            holds.append({"group": group, "start": start, "end": time.monotonic(), "who": who})
            counts[who.split("-")[0]] += 1

    def holder(idx: int) -> None:
        rng = random.Random(idx)
        while not stop.is_set():
            tx = b.transaction()
            try:
                held = hold_and_reply(tx, rng, alone=0.2)
                if held is None:
                    continue
                g, start, went_on = held
                note(g, start, f"holder-{idx}")
                if went_on:
                    tx.commit()  # the lock alone is rolled back
            finally:
                tx.rollback()  # a no-op once committed

    def sender(idx: int) -> None:
        rng = random.Random(100 + idx)
        while not stop.is_set():
            g, handles = rng.choice(groups)
            with b.transaction() as tx:
                tx.send(rng.choice(handles), inv.REQUEST, {"from": "sender"})
                start = time.monotonic()
                time.sleep(rng.uniform(0, 0.03))
                note(g, start, f"sender-{idx}")

    replier = reply_to_every_request(b, stop)
    # The senders first: they lock by name until the holders' first GET CONVERSATION GROUP starts
    # this process's receiver of ReplyQueue, which must then keep their locks (local_holds.py).
    threads = [threading.Thread(target=guarded(sender), args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=guarded(holder), args=(i,)) for i in range(2)]
    for i, t in enumerate(threads):
        t.start()
        if i == 1:
            time.sleep(1.0)
    stop.wait(seconds)
    stop.set()
    for t in [*threads, replier]:
        t.join(60)
    return counts, inv.hold_overlaps(holds), failures


def test_send_only_transactions_never_overlap_a_get_conversation_group_holder(ns_broker):
    """The invariant run, 20 s: overlapping holds 0."""
    counts, overlaps, failures = race(ns_broker, 20)
    print(
        f"group race: {counts['holder']} holder and {counts['sender']} send-only transactions, {len(overlaps)} overlaps"
    )
    assert failures == []
    assert counts["holder"] > 20 and counts["sender"] > 20
    assert overlaps == []


def test_the_race_counts_overlaps_without_the_statements_group_lock(ns_broker, monkeypatch):
    """The same run with the statements' group lock removed on purpose: the checker sees overlaps."""
    monkeypatch.setattr(GroupLocks, "lock", lambda self, ep, group=None, new=False: None)
    counts, overlaps, failures = race(ns_broker, 8)
    print(f"group race without the lock: {counts}, {len(overlaps)} overlaps")
    assert failures == []
    assert overlaps


def test_get_conversation_group_load_send_save_commit_never_interleaves_with_a_send(ns_broker):
    """Microsoft's pattern: GET CONVERSATION GROUP, load the group's state, SEND, save the state,
    COMMIT; a concurrent transaction that only SENDs on a conversation of the group (and counts
    itself in the same state) never runs between the load and the save: no update is lost."""
    b = ns_broker
    g, handles = dialogs_in_one_group(b, 2)
    for h in handles:
        b.send(h, inv.REQUEST, {"seed": True})
    state = {"version": 0}
    done = {"holder": 0, "sender": 0}
    stop = threading.Event()

    def holder() -> None:
        while not stop.is_set():
            with b.transaction() as tx:
                if tx.get_conversation_group("ReplyQueue", wait=0.5) != g:
                    continue
                loaded = state["version"]  # load the group's state
                msgs = tx.receive("ReplyQueue", top=5, conversation_group=g)
                tx.send(msgs[0].conversation_handle if msgs else handles[0], inv.REQUEST, {"v": loaded})
                time.sleep(0.02)
                state["version"] = loaded + 1  # save it
                done["holder"] += 1
            time.sleep(0.05)  # the lock is not fair: leave the sender a turn

    def sender() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            with b.transaction() as tx:
                tx.send(rng.choice(handles), inv.REQUEST, {"send_only": True})
                loaded = state["version"]
                time.sleep(0.01)
                state["version"] = loaded + 1
                done["sender"] += 1
            time.sleep(0.05)  # the lock is not fair (no queue of waiters): leave the holder a turn

    replier = reply_to_every_request(b, stop)
    threads = [threading.Thread(target=holder), threading.Thread(target=sender)]
    for t in threads:
        t.start()
    time.sleep(15)
    stop.set()
    for t in [*threads, replier]:
        t.join(60)
    print(f"pattern: {done['holder']} holder and {done['sender']} send-only commits, version {state['version']}")
    assert done["holder"] > 5 and done["sender"] > 5
    assert state["version"] == done["holder"] + done["sender"]  # no update lost
