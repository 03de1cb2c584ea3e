"""Several conversation groups in one transaction (tx.receive_groups), against the real broker:
each group locked until COMMIT, a rollback giving every one back, the window for late groups,
the asyncio form, and a run of batching readers checked for lost, duplicated and reordered
messages and for a group held by two transactions at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kbroker import errors
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk import aio
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv

QUEUE = "RequestQueue"


@pytest.fixture
def ns_broker(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace)
    yield b
    b.close()


def dialogs(b: Broker, n: int, each: int = 1) -> list[str]:
    """n dialogs (each its own group on the target's side), `each` requests on every one."""
    handles = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(n)]
    for h in handles:
        for i in range(each):
            b.send(h, inv.REQUEST, {"i": i})
    return handles


def test_one_group_ready_comes_back_at_once_while_more_records_arrive(ns_broker):
    """With one group ready and within=0, receive_groups returns it at once: its further RECEIVEs
    take what the process holds and do not wait, as a first RECEIVE does, for the partitions to be
    read to their end, which Kafka reports only at the next empty fetch (up to 500 ms later; every
    call here took 500 ms so before). Each request is sent just before its RECEIVE, so the
    partition was never read to its end when the group came."""
    b = ns_broker
    (h,) = dialogs(b, 1)
    with b.transaction() as tx:  # the first: the receiver's start and assignment
        assert len(tx.receive_groups(QUEUE, groups=10, wait=30)) == 1
    took = []
    for i in range(5):
        b.send(h, inv.REQUEST, {"i": i})
        with b.transaction() as tx:
            started = time.monotonic()
            got = tx.receive_groups(QUEUE, groups=10, wait=10)
            took.append(time.monotonic() - started)
        assert [len(batch) for batch in got] == [1]
    assert sorted(took)[2] < 0.3, f"receive_groups took {[round(t, 3) for t in took]} s"


def test_groups_are_locked_until_commit_and_a_rollback_gives_them_all_back(ns_broker):
    """Three groups of five taken in one transaction: another transaction gets only the other
    two; after a rollback the three come back whole and in order; a COMMIT consumes them."""
    b = ns_broker
    dialogs(b, 5, each=2)
    tx = b.transaction()
    first = tx.receive_groups(QUEUE, groups=3, wait=10)
    assert len(first) == 3
    assert len({batch[0].conversation_group_id for batch in first}) == 3
    assert all(len({m.conversation_group_id for m in batch}) == 1 for batch in first)
    other = b.transaction()
    rest = other.receive_groups(QUEUE, groups=10, wait=5, within=1.0)
    assert {batch[0].conversation_group_id for batch in rest}.isdisjoint(
        {batch[0].conversation_group_id for batch in first}
    )
    assert sum(len(batch) for batch in rest) == 4  # two groups of two: the locked three are not taken
    other.commit()
    tx.rollback()
    with b.transaction() as again:
        back = again.receive_groups(QUEUE, groups=10, wait=5)
        assert sorted(batch[0].conversation_group_id for batch in back) == sorted(
            batch[0].conversation_group_id for batch in first
        )
        assert all([m.message_sequence_number for m in batch] == [0, 1] for batch in back)
    with b.transaction() as empty:
        assert empty.receive_groups(QUEUE, groups=10, wait=0.5) == []


def test_the_window_waits_for_later_groups_and_groups_one_is_receive(ns_broker):
    """within=W: a group that arrives W/3 after the first joins the batch; groups=1 takes one
    group as RECEIVE does; bad arguments are refused before anything is taken."""
    b = ns_broker
    h1, h2 = dialogs(b, 2, each=0)
    b.send(h1, inv.REQUEST, {"i": 0})
    threading.Timer(1.0, lambda: b.send(h2, inv.REQUEST, {"i": 0})).start()
    with b.transaction() as tx:
        got = tx.receive_groups(QUEUE, groups=5, wait=10, within=3.0)
    assert sorted(len(batch) for batch in got) == [1, 1]
    dialogs(b, 2)
    with b.transaction() as tx:
        assert len(tx.receive_groups(QUEUE, groups=1, wait=10)) == 1
    with b.transaction() as tx:
        for bad in (0, -1, True, 1.5):
            with pytest.raises(errors.InvalidArgumentError, match="groups"):
                tx.receive_groups(QUEUE, groups=bad)
        with pytest.raises(errors.InvalidArgumentError, match="within"):
            tx.receive_groups(QUEUE, groups=2, within=-1)
        assert len(tx.receive_groups(QUEUE, groups=5, wait=5)) == 1  # nothing was taken by the refusals


def test_the_asyncio_form(kafka_bootstrap, namespace, ns_broker):
    dialogs(ns_broker, 4)

    async def run() -> list[list]:
        broker = await aio.connect(kafka_bootstrap, namespace)
        try:
            async with broker.transaction() as tx:
                return await tx.receive_groups(QUEUE, groups=4, wait=10, within=1.0)
        finally:
            await broker.close()

    got = asyncio.run(run())
    assert len(got) == 4 and all(len(batch) == 1 for batch in got)


def test_batching_readers_lose_duplicate_reorder_and_overlap_nothing(ns_broker):
    """Four reader threads, each taking up to 8 groups per transaction and rolling back every
    fifth: 40 dialogs of 15 requests each are received exactly once in commits, each dialog's
    requests in order, and no group is held by two transactions at once (their intervals from
    receive_groups' return to the end of the transaction, each within the true hold, never
    overlap)."""
    b = ns_broker
    n_dialogs, each = 40, 15
    dialogs(b, n_dialogs, each=each)
    lock = threading.Lock()
    committed: dict[str, list[int]] = {}  # conversation id -> sequence numbers, in commit order
    held: dict[str, list[tuple[float, float, int]]] = {}  # group -> (from, to, reader)
    failures: list[BaseException] = []
    stop = threading.Event()
    total = n_dialogs * each

    def reader(me: int) -> None:
        tries = 0
        try:
            while not stop.is_set():
                tries += 1
                tx = b.transaction()
                batches = tx.receive_groups(QUEUE, groups=8, wait=0.5, within=0.05)
                taken_at = time.monotonic()  # within each group's hold: overlaps found are real
                if not batches:
                    tx.rollback()
                    continue
                roll = tries % 5 == 0
                if roll:
                    tx.rollback()
                else:
                    tx.commit()
                ended = time.monotonic()
                with lock:
                    for batch in batches:
                        held.setdefault(batch[0].conversation_group_id, []).append((taken_at, ended, me))
                        if not roll:
                            for m in batch:
                                committed.setdefault(m.conversation_id, []).append(m.message_sequence_number)
                    if sum(len(v) for v in committed.values()) >= total:
                        stop.set()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    stop.wait(180)
    stop.set()
    for t in threads:
        t.join(30)
    assert not failures, failures
    lost = n_dialogs - len(committed) + sum(max(0, each - len(set(v))) for v in committed.values())
    duplicated = sum(len(v) - len(set(v)) for v in committed.values())
    reordered = sum(v != sorted(v) for v in committed.values())
    overlaps = 0
    for spans in held.values():
        spans.sort()
        overlaps += sum(later[0] < earlier[1] and later[2] != earlier[2] for earlier, later in zip(spans, spans[1:]))
    assert (lost, duplicated, reordered, overlaps) == (0, 0, 0, 0)
    assert max(len(v) for v in held.values()) >= 1 and len(held) == n_dialogs
