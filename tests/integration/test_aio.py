"""The asyncio API against the real broker: no statement blocks the event loop (a SEND waiting for
a conversation lock another transaction holds included), a cancelled statement cannot leak its
lock past the rollback, and the statements the sync Transaction and Broker offer are there too
(GET CONVERSATION GROUP, BEGIN CONVERSATION TIMER, the catalog and queue status)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
import pytest

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.catalog.models import DIALOG_TIMER
from kbroker.errors import InvalidArgumentError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.dialogs.timer_service import TimerService
from kbroker.sdk.aio import AsyncBroker
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv
from tests.helpers import receive_at_least

T = TypeVar("T")

TICK = 0.05  # the heartbeat task's period
HOLD = 2.0  # how long the sync transaction keeps the conversation locked


def hold_conversation_lock(
    broker: Broker, handle: str, held: threading.Event, committed_at: list[float]
) -> threading.Thread:
    """A thread whose transaction SENDs on `handle` (taking its conversation lock), keeps it HOLD
    seconds, then commits; `held` is set once the lock is taken, `committed_at` gets the commit time."""

    def run() -> None:
        tx = broker.transaction()
        tx.send(handle, CLAIM, {"n": "sync"})
        held.set()
        time.sleep(HOLD)
        tx.commit()
        assert tx.committed_at is not None
        committed_at.append(tx.committed_at)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def with_heartbeat(work: Callable[[], Awaitable[T]]) -> tuple[T, float, int]:
    """Run `work` while a task ticks every TICK seconds: (its result, the longest gap between two
    ticks, the number of ticks). A gap far above TICK means something blocked the event loop."""
    done = asyncio.Event()
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(TICK)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beating = asyncio.create_task(heartbeat())
    try:
        result = await work()
    finally:
        done.set()
        await beating
    return result, max(gaps), len(gaps)


def test_a_send_waiting_for_a_conversation_lock_does_not_block_the_event_loop(broker):
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    held, committed_at = threading.Event(), []
    abroker = AsyncBroker(broker)  # the same Broker: its conversation locks are shared

    async def send_on_the_locked_conversation() -> tuple[float, float]:
        thread = hold_conversation_lock(broker, handle, held, committed_at)
        assert await asyncio.to_thread(held.wait, 15), "the sync transaction never sent"
        started = time.monotonic()
        async with abroker.transaction() as tx:
            await tx.send(handle, CLAIM, {"n": "async"})
            sent_at, waited = time.time(), time.monotonic() - started
        await asyncio.to_thread(thread.join, 15)
        return sent_at, waited

    (sent_at, waited), longest_gap, ticks = asyncio.run(with_heartbeat(send_on_the_locked_conversation))
    assert waited >= HOLD - 0.5, f"the async SEND did not wait for the lock ({waited:.2f} s)"
    assert longest_gap < 0.5, f"the event loop stood still for {longest_gap:.2f} s"
    assert ticks >= HOLD / TICK / 2
    assert committed_at and sent_at >= committed_at[0], "the async SEND returned before the sync commit"
    got = receive_at_least(broker, "ExpenseQueue", 2)
    assert [(m.message_sequence_number, orjson.loads(m.body)["n"]) for m in got] == [(0, "sync"), (1, "async")]


def test_a_cancelled_send_never_keeps_the_conversation_lock_after_the_rollback(broker):
    # The SEND's thread runs on after its task is cancelled; the rollback of `async with` must
    # wait for it, or the lock it takes later would stay held by a finished transaction.
    broker.runtime.conversation_locks.timeout = 8.0  # a leaked lock fails the last SEND in 8 s, not 30
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    held, committed_at = threading.Event(), []
    abroker = AsyncBroker(broker)

    async def cancel_a_waiting_send() -> str:
        thread = hold_conversation_lock(broker, handle, held, committed_at)
        assert await asyncio.to_thread(held.wait, 15)
        tx = abroker.transaction()
        with pytest.raises(asyncio.TimeoutError):
            async with tx:
                await asyncio.wait_for(tx.send(handle, CLAIM, {"n": "cancelled"}), 0.3)
        assert tx.state == "rolled back"
        await asyncio.to_thread(thread.join, 15)
        return await abroker.send(handle, CLAIM, {"n": "after"})

    asyncio.run(cancel_a_waiting_send())
    got = receive_at_least(broker, "ExpenseQueue", 2)
    assert [(m.message_sequence_number, orjson.loads(m.body)["n"]) for m in got] == [(0, "sync"), (1, "after")]
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []


def test_get_conversation_group_locks_the_group_it_names(broker):
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    sent = [broker.send(handle, CLAIM, {"n": i}) for i in range(3)]
    abroker = AsyncBroker(broker)

    async def main() -> tuple[str | None, str | None, list[str], list[str], float | None]:
        async with abroker.transaction() as tx:
            group = await tx.get_conversation_group("ExpenseQueue", wait=15)
            async with abroker.transaction() as other:
                other_group = await other.get_conversation_group("ExpenseQueue", wait=0.5)  # locked
            msgs = await tx.receive("ExpenseQueue", top=10, wait=5, conversation_group=group)
            assert tx.state == "open" and tx.committed_at is None
        return (
            group,
            other_group,
            [m.message_id for m in msgs],
            [m.conversation_group_id for m in msgs],
            tx.committed_at,
        )

    group, other_group, received, groups, committed_at = asyncio.run(main())
    assert group is not None and other_group is None
    assert received == sent and set(groups) == {group}
    assert committed_at is not None
    assert broker.receive("ExpenseQueue", top=10, wait=1) == []  # the commit consumed them


def test_dialog_timers_armed_through_the_async_api_fire(
    kafka_bootstrap, namespace, broker, timer_service: TimerService
):
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    abroker = AsyncBroker(broker)

    async def arm_and_receive() -> list[tuple[str, str]]:
        fired = []
        armed = time.time()
        await abroker.begin_conversation_timer(handle, 1)  # outside a transaction
        for m in await abroker.receive("EmployeeQueue", top=10, wait=15):
            fired.append((m.message_type_name, m.conversation_handle))
        assert time.time() - armed >= 1.0, "fired early"
        async with abroker.transaction() as tx:  # inside one: armed at commit
            await tx.begin_conversation_timer(handle, 1)
            assert (await tx.endpoint(handle)).conversation_handle == handle
        for m in await abroker.receive("EmployeeQueue", top=10, wait=15):
            fired.append((m.message_type_name, m.conversation_handle))
        return fired

    assert asyncio.run(arm_and_receive()) == [(DIALOG_TIMER, handle), (DIALOG_TIMER, handle)]


def test_catalog_and_queue_status_are_awaited(broker):
    abroker = AsyncBroker(broker)

    async def main() -> tuple[set[str], set[str], bool]:
        catalog = await abroker.catalog()
        refreshed = await abroker.refresh_catalog()
        return set(catalog.queues), set(refreshed.queues), await abroker.queue_enabled("ExpenseQueue")

    queues, refreshed, enabled = asyncio.run(main())
    assert "ExpenseQueue" in queues and queues == refreshed and enabled
    assert (abroker.bootstrap, abroker.namespace) == (broker.bootstrap, broker.namespace)


def test_receives_waiting_beyond_the_default_executors_size_hold_back_no_other_statement(broker):
    """The loop's default executor has min(32, CPUs + 4) threads (6 on two cores): on it, that
    many RECEIVEs waiting on an empty queue held back every other statement until one timed out.
    The broker's own executor (`concurrency` threads) leaves room for a SEND meanwhile."""
    waiters, wait = 12, 3.0
    abroker = AsyncBroker(broker, concurrency=waiters + 4)
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)

    async def main() -> tuple[float, list[int]]:
        async def waiting_receive() -> int:
            async with abroker.transaction() as tx:
                return len(await tx.receive("EmployeeQueue", wait=wait))

        receives = [asyncio.create_task(waiting_receive()) for _ in range(waiters)]
        await asyncio.sleep(0.5)  # every RECEIVE is waiting in its thread now
        t0 = time.monotonic()
        await abroker.send(handle, CLAIM, {"n": 1})
        took = time.monotonic() - t0
        return took, await asyncio.gather(*receives)

    took, got = asyncio.run(main())
    assert got == [0] * waiters
    assert took < wait - 1.0, f"the SEND waited {took:.1f} s behind the waiting RECEIVEs"
    with pytest.raises(InvalidArgumentError):
        AsyncBroker(broker, concurrency=0)


def test_many_asyncio_readers_sharing_the_group_commit_keep_g1_order_and_exactly_once(kafka_bootstrap, namespace):
    """128 coroutine readers of one AsyncBroker (32 threads), each RECEIVE TOP(2), an awaited
    pause, a reply recording what it got, then commit, or roll back at random: every request is
    answered exactly once, each conversation's requests in order, and no two committed
    transactions held one conversation group at once (tests/helpers/invariants.py)."""
    conversations, per_conversation, readers = 60, 3, 128
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    sync = Broker(kafka_bootstrap, namespace)
    abroker = AsyncBroker(sync, concurrency=32)
    logs: list[dict] = []
    try:
        sent = inv.send_requests(sync, conversations, per_conversation)

        async def reader(idx: int) -> None:
            rng = random.Random(idx)
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 3.0:
                tx = abroker.transaction()
                msgs = await tx.receive("RequestQueue", top=2, wait=0.5)
                if not msgs:
                    await tx.rollback()
                    continue
                idle_since, leased = time.monotonic(), time.time()
                await asyncio.sleep(rng.uniform(0, 0.01))
                body = {
                    "pid": os.getpid(),
                    "reader": idx,
                    "leased": leased,
                    "conversation_id": msgs[0].conversation_id,
                    "group": msgs[0].conversation_group_id,
                    "seqs": [m.message_sequence_number for m in msgs],
                    "ids": [m.message_id for m in msgs],
                }
                await tx.send(msgs[0].conversation_handle, inv.REPLY, body)
                if rng.random() < 0.1:
                    await tx.rollback()
                    continue
                body["committing"] = time.time()
                await tx.commit()
                logs.append({**body, "committed": tx.committed_at})

        async def main() -> None:
            await asyncio.gather(*(reader(i) for i in range(readers)))

        asyncio.run(main())
        replies = inv.read_replies(kafka_bootstrap, names.queue_topic(namespace, "ReplyQueue"))
    finally:
        sync.close()
    report = inv.check(sent, replies, logs, per_conversation)
    assert report.sent == conversations * per_conversation
    assert (report.lost, report.duplicated, report.unknown) == ([], [], [])
    assert report.order_violations == [] and report.lock_violations == []
    assert report.committed == len(logs) > conversations  # TOP(2) of 3: at least two per dialog
