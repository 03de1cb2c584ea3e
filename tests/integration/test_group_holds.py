"""The conversation group lock across processes (core/dialogs/group_hold.py,
kafka/dialogs/group_holds.py), against the real broker: a process that SENDs on conversations of
a group another process RECEIVEs from holds the group through the holds topic, so its send-only
transactions never overlap the reader's GET CONVERSATION GROUP + RECEIVE holders."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest

from kbroker import errors
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv
from tests.integration.test_group_locks import (
    dialogs_in_one_group,
    hold_and_reply,
    reply_to_every_request,
    seeded_groups,
)


def remote_senders(bootstrap: str, namespace: str, tmp: Path, groups, seconds: float, n: int) -> list[dict]:
    """`n` processes of send-only transactions on the conversations of `groups`: their outputs."""
    children = []
    for i in range(n):
        out = tmp / f"remote-{i}.json"
        argv = [sys.executable, "-m", "tests.helpers.group_race_child", bootstrap, namespace, str(seconds)]
        argv += [orjson.dumps([[g, hs] for g, hs in groups]).decode(), str(out)]
        children.append((subprocess.Popen(argv, env=CHILD_ENV, stderr=subprocess.PIPE, text=True), out))
    results = []
    for child, out in children:
        _, err = child.communicate(timeout=seconds + 120)
        assert child.returncode == 0, err[-3000:]
        results.append(orjson.loads(out.read_bytes()))
    return results


CHILD_ENV = {**os.environ, "PYTHONPATH": os.getcwd()}


def write_foreign_holds(bootstrap: str, namespace: str) -> None:
    """Records another client may write on the holds topic: garbage, a large one, JSON of the
    wrong shape, a forged claim with wrong types, and no key at all."""
    from confluent_kafka import Producer

    from kbroker.core import names

    topic, p = names.holds_topic(namespace), Producer({"bootstrap.servers": bootstrap})
    forged = {"kind": "claim", "group": 7, "partition": "x", "holder": None, "epoch": -1}
    for key, value in [
        (b"g", b"\xff\x00 not json"),
        (b"g", b"[" * 50_000),
        (b"g", b'{"a": 1}'),
        (str(uuid.uuid4()).encode(), orjson.dumps(forged)),
        (None, b"{}"),
    ]:
        p.produce(topic, value, key=key)
    assert p.flush(30) == 0


def cross_process_race(
    bootstrap: str, namespace: str, tmp: Path, seconds: float, *, unlocked: bool = False, foreign: bool = False
):
    """This process: 2 GET CONVERSATION GROUP + RECEIVE + SEND holders of ReplyQueue (its only
    reader) and the replier; another process: 2 send-only transactions on the conversations of
    the same 2 groups. Returns the counts, the overlapping holds and both sides' errors."""
    apply_paths(bootstrap, namespace, [inv.YAML])
    if foreign:
        write_foreign_holds(bootstrap, namespace)
    b = Broker(bootstrap, namespace, lock_timeout=20.0)
    try:
        groups = seeded_groups(b, 2, 3)
        stop = threading.Event()
        holds: list[dict] = []
        failures: list[str] = []
        lock = threading.Lock()

        def holder(idx: int) -> None:
            rng = random.Random(idx)
            try:
                while not stop.is_set():
                    with b.transaction() as tx:
                        held = hold_and_reply(tx, rng)
                        if held is None:
                            continue
                        g, start, _ = held
                        with lock:
                            holds.append({"group": g, "start": start, "end": time.monotonic(), "who": f"holder-{idx}"})
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(f"{type(exc).__name__}: {exc}")
                stop.set()

        # The reader owns ReplyQueue's partitions (and the replies are there) before the other
        # process starts.
        replier = reply_to_every_request(b, stop)
        first = b.transaction()
        assert first.get_conversation_group("ReplyQueue", wait=15) is not None
        first.rollback()
        threads = [threading.Thread(target=holder, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        out = tmp / "remote.json"
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.helpers.group_race_child",
                bootstrap,
                namespace,
                str(seconds),
                orjson.dumps([[g, hs] for g, hs in groups]).decode(),
                str(out),
                *(["unlocked"] if unlocked else []),
            ],
            env=CHILD_ENV,
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
        stop.set()
        for t in [*threads, replier]:
            t.join(60)
        assert child.returncode == 0, child.stderr[-3000:]
        remote = orjson.loads(out.read_bytes())
        everything = holds + remote["holds"]
        counts = {
            "holder": sum(1 for h in everything if h["who"].startswith("holder")),
            "remote": sum(1 for h in everything if h["who"].startswith("remote")),
        }
        return counts, inv.hold_overlaps(everything), failures + remote["errors"]
    finally:
        b.close()


def test_send_only_transactions_of_another_process_never_overlap_a_reader_holding_the_group(
    kafka_bootstrap, namespace, tmp_path
):
    """The invariant run across processes, 20 s: overlapping holds 0."""
    counts, overlaps, failures = cross_process_race(kafka_bootstrap, namespace, tmp_path, 20)
    print(f"cross-process group race: {counts}, {len(overlaps)} overlaps, failures {failures}")
    assert failures == []
    assert counts["holder"] > 20 and counts["remote"] > 20
    assert overlaps == []


def test_foreign_records_on_the_holds_topic_leave_the_race_going_and_locked(kafka_bootstrap, namespace, tmp_path):
    """The same run, 10 s, after garbage, oversize, misshapen, forged and keyless records on the
    holds topic: both sides go on (transactions on each), overlapping holds 0."""
    counts, overlaps, failures = cross_process_race(kafka_bootstrap, namespace, tmp_path, 10, foreign=True)
    print(f"cross-process group race after foreign holds records: {counts}, {len(overlaps)} overlaps")
    assert failures == []
    assert counts["holder"] > 10 and counts["remote"] > 10
    assert overlaps == []


def test_the_cross_process_race_counts_overlaps_without_the_group_lock(kafka_bootstrap, namespace, tmp_path):
    """The same run with the other process's group lock removed on purpose: the checker sees overlaps."""
    counts, overlaps, failures = cross_process_race(kafka_bootstrap, namespace, tmp_path, 8, unlocked=True)
    print(f"cross-process group race without the lock: {counts}, {len(overlaps)} overlaps")
    assert failures == []
    assert overlaps


def test_where_no_process_reads_the_queue_senders_in_two_processes_take_turns(kafka_bootstrap, namespace, tmp_path):
    """No reader of ReplyQueue anywhere: each process takes the hold itself (`take`), the other
    asks for it (`want`) and waits: overlapping holds of the two processes 0."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=20.0)
    try:
        groups = [dialogs_in_one_group(b, 3) for _ in range(2)]
    finally:
        b.close()
    results = remote_senders(kafka_bootstrap, namespace, tmp_path, groups, 15, 2)
    holds = []
    for i, r in enumerate(results):
        assert r["errors"] == []
        holds += [{**h, "who": f"p{i}-{h['who']}"} for h in r["holds"]]
    overlaps = inv.hold_overlaps(holds)
    counts = [len(r["holds"]) for r in results]
    print(f"ownerless group race: {counts} transactions, {len(overlaps)} overlaps")
    assert min(counts) > 10
    assert overlaps == []


def test_a_killed_holder_keeps_the_group_only_until_its_hold_runs_out(kafka_bootstrap, namespace):
    """kill -9 of a process holding a group the reader owns: RECEIVE leaves the group alone while
    the hold lives and takes its messages once it ran out (10 s, and the 2 s margin)."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace, lock_timeout=20.0)
    stop = threading.Event()
    replier = None
    try:
        g, handles = dialogs_in_one_group(b, 2)
        for h in handles:
            b.send(h, inv.REQUEST, {"seed": True})
        replier = reply_to_every_request(b, stop)
        first = b.transaction()
        assert first.get_conversation_group("ReplyQueue", wait=15) == g
        first.rollback()  # this process reads ReplyQueue: it owns the group's partition
        argv = [sys.executable, "-m", "tests.helpers.group_race_child", kafka_bootstrap, namespace, "hold", handles[0]]
        child = subprocess.Popen(argv, env=CHILD_ENV, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "held"
            with b.transaction() as tx:
                assert tx.get_conversation_group("ReplyQueue", wait=2) is None  # held by the child
        finally:
            child.kill()
            child.wait(10)
        killed = time.monotonic()
        with b.transaction() as tx:
            assert tx.get_conversation_group("ReplyQueue", wait=30) == g
            waited = time.monotonic() - killed
            assert tx.receive("ReplyQueue", conversation_group=g)
        print(f"group free {waited:.1f} s after the holder's kill -9")
        assert waited < 16
    finally:
        stop.set()
        if replier is not None:
            replier.join(30)
        b.close()


def test_the_partition_a_hold_names_is_the_one_kbrokers_producer_chooses(kafka_bootstrap, namespace):
    """A hold names its group's partition (kafka/dialogs/hold_topic.partition_of): librdkafka's
    default partitioner, CRC-32 of the key, as the producer that SENDs uses it."""
    from kbroker.kafka.clients import idempotent_producer
    from kbroker.kafka.dialogs.hold_topic import partition_of
    from kbroker.kafka.topics import create_missing_topics

    topic = f"{namespace}.partitioner"
    create_missing_topics(kafka_bootstrap, {topic: 7}, {})
    producer = idempotent_producer(kafka_bootstrap)
    seen: dict[str, int] = {}
    keys = [str(uuid.uuid4()) for _ in range(200)]
    for k in keys:
        producer.produce(
            topic,
            b"x",
            key=k.encode(),
            on_delivery=lambda err, msg: seen.__setitem__(msg.key().decode(), msg.partition()),
        )
    producer.flush(30)
    assert len(seen) == len(keys)
    assert all(seen[k] == partition_of(k, 7) for k in keys)
    assert len(set(seen.values())) == 7


def test_a_send_that_takes_a_new_hold_waits_on_kafka_not_on_the_follower(kafka_bootstrap, namespace):
    """SENDs on 40 dialogs, each of its own group, in a process that reads none of their queues:
    the second SEND on each takes the group's hold (a `take` record, read back; the first, on a
    group this process has just made, needs none). The follower used to wait out its 20 ms poll
    for fewer than 500 records, so every such SEND waited 20 ms or more (42 ms p50 measured);
    Kafka's part is a few round trips."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    b = Broker(kafka_bootstrap, namespace)
    try:
        handles = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(41)]
        for h in handles:
            b.send(h, inv.REQUEST, {"n": 1})
        holds = b.runtime.group_holds
        before = len(holds._mine)
        took = []
        for h in handles[1:]:
            started = time.perf_counter()
            b.send(h, inv.REQUEST, {"n": 2})
            took.append(time.perf_counter() - started)
        took.sort()
        print(
            f"SEND taking a hold: p50 {took[len(took) // 2] * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms; "
            f"holds {before} then {len(holds._mine)}"
        )
        assert len(holds._mine) - before >= 35  # they did take holds
        assert took[len(took) // 2] < 0.015
    finally:
        b.close()


def test_closing_the_holds_topic_while_statements_ask_its_end_fails_none_of_them(kafka_bootstrap, namespace):
    """Statements (and a poll thread's owned()) ask the holds topic's end of a consumer of their
    own threads (HoldTopic.catch_up); close() waits for those asking. The binding refuses a call on
    a closed consumer: without that wait a RuntimeError came out of catch_up in every run of
    this test, where a caller expects True or False."""
    import concurrent.futures

    from kbroker.kafka.dialogs.hold_topic import HoldTopic

    rounds, outcomes = 12, []
    for _ in range(rounds):
        topic = HoldTopic(kafka_bootstrap, f"{namespace}-{uuid.uuid4().hex[:6]}", threading.Condition())
        topic.start(30)
        stop = threading.Event()

        def ask(topic: HoldTopic = topic, stop: threading.Event = stop) -> list[object]:
            got: list[object] = []
            while not stop.is_set():
                try:
                    got.append(topic.catch_up(time.monotonic() + 5))
                except Exception as exc:  # noqa: BLE001 - what the test counts
                    got.append(exc)
            return got

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            asking = [pool.submit(ask) for _ in range(4)]
            time.sleep(0.2)
            topic.close()
            stop.set()
            outcomes += [o for f in asking for o in f.result(timeout=30)]
    failed = [o for o in outcomes if not isinstance(o, bool)]
    assert not failed, failed[:3]
    assert outcomes.count(True) > rounds, "the threads never asked"


def groups_with_a_reply(b: Broker, n: int) -> list[tuple[str, list[str]]]:
    """`n` groups of ReplyQueue, two dialogs each, a reply waiting in each."""
    made = [dialogs_in_one_group(b, 2) for _ in range(n)]
    for _, (h1, _h2) in made:
        b.send(h1, inv.REQUEST, {"seed": True})
    for _ in made:
        with b.transaction() as tx:
            m = tx.receive("RequestQueue", wait=15)[0]
            tx.send(m.conversation_handle, inv.REPLY, {})
    return made


def test_a_send_only_transaction_open_across_a_rebalance_is_aborted_before_the_next_owner_serves(
    kafka_bootstrap, namespace
):
    """The queue's reader SENDs on a conversation of each of 8 groups in one transaction (locks
    that take no record) and keeps it open while a second reader joins and is given some of the
    partitions. The revocation waits `revoke_grace` for it, then dooms it: when the new reader's
    GET CONVERSATION GROUP takes one of those groups, that transaction's COMMIT fails
    (RebalanceAbortedError, retriable) and nothing it sent is delivered."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    a = Broker(kafka_bootstrap, namespace, lock_timeout=20.0, revoke_grace=1.0)
    b = None
    try:
        made = groups_with_a_reply(a, 8)
        with a.transaction() as tx:  # a's receiver owns every partition of ReplyQueue
            assert tx.get_conversation_group("ReplyQueue", wait=15) is not None
            tx.rollback()
        held = a.transaction()
        for _, (_h1, h2) in made:
            held.send(h2, inv.REQUEST, {"held": True})
        b = Broker(kafka_bootstrap, namespace, lock_timeout=20.0, revoke_grace=1.0)
        got = None
        deadline = time.monotonic() + 30
        while got is None and time.monotonic() < deadline:
            with b.transaction() as other:
                got = other.get_conversation_group("ReplyQueue", wait=2)
                other.rollback()
        assert got in {g for g, _ in made}, "the joining reader was given no partition with a group"
        with pytest.raises(errors.RebalanceAbortedError):
            held.commit()
        with a.transaction() as tx:
            sent = tx.receive("RequestQueue", top=100, wait=3)
        assert [orjson.loads(m.body) for m in sent if orjson.loads(m.body).get("held")] == []
    finally:
        if b is not None:
            b.close()
        a.close()


def rebalancing_race(bootstrap: str, namespace: str, seconds: float) -> tuple[int, int, list[str], list[str]]:
    """Two readers of ReplyQueue (Broker instances, each its own process to the broker), each with
    2 GET CONVERSATION GROUP + RECEIVE + SEND holders and 2 send-only transactions on the
    conversations of 4 groups, while a third reader joins and leaves every 5 s (a rebalance each
    time). A hold counts once its transaction committed. Returns the committed and aborted
    transactions, the overlapping committed holds, the threads' errors."""
    apply_paths(bootstrap, namespace, [inv.YAML])
    brokers = [Broker(bootstrap, namespace, lock_timeout=20.0, revoke_grace=1.0) for _ in range(2)]
    groups = seeded_groups(brokers[0], 4, 2)
    stop = threading.Event()
    holds: list[dict] = []
    lock = threading.Lock()
    failures: list[str] = []
    aborted = [0]

    def guarded(run):
        def go(*args) -> None:
            try:
                run(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(f"{type(exc).__name__}: {exc}")
                stop.set()

        return go

    def commit(tx, hold: dict) -> None:
        try:
            tx.commit()
        except (errors.TransactionAbortedError, errors.ConversationLockTimeoutError):
            aborted[0] += 1  # a rebalance doomed it: it held nothing that counts
            return
        with lock:
            holds.append(hold)

    def holder(b: Broker, idx: int) -> None:
        rng = random.Random(idx)
        while not stop.is_set():
            tx = b.transaction()
            try:
                held = hold_and_reply(tx, rng)
                if held is None:
                    continue
                g, start, _ = held
                commit(tx, {"group": g, "start": start, "end": time.monotonic(), "who": f"holder-{idx}"})
            finally:
                tx.rollback()

    def sender(b: Broker, idx: int) -> None:
        rng = random.Random(100 + idx)
        while not stop.is_set():
            g, handles = rng.choice(groups)
            tx = b.transaction()
            try:
                tx.send(rng.choice(handles), inv.REQUEST, {"from": "sender"})
                start = time.monotonic()
                time.sleep(rng.uniform(0, 0.03))
                commit(tx, {"group": g, "start": start, "end": time.monotonic(), "who": f"sender-{idx}"})
            except errors.ConversationLockTimeoutError:
                aborted[0] += 1
            finally:
                tx.rollback()

    def churn() -> None:
        while not stop.is_set():
            c = Broker(bootstrap, namespace, lock_timeout=20.0, revoke_grace=1.0)
            try:
                with c.transaction() as tx:
                    tx.get_conversation_group("ReplyQueue", wait=3)
                stop.wait(3)
            finally:
                c.close()
            stop.wait(2)

    replier = reply_to_every_request(brokers[0], stop)
    threads = [threading.Thread(target=guarded(churn))]
    for i, b in enumerate(brokers):
        threads += [threading.Thread(target=guarded(holder), args=(b, 10 * i + k)) for k in range(2)]
        threads += [threading.Thread(target=guarded(sender), args=(b, 10 * i + k)) for k in range(2)]
    try:
        for t in threads:
            t.start()
        stop.wait(seconds)
    finally:
        stop.set()
        for t in [*threads, replier]:
            t.join(60)
        for b in brokers:
            b.close()
    return len(holds), aborted[0], inv.hold_overlaps(holds), failures


@pytest.mark.long
def test_committed_holds_never_overlap_while_readers_join_and_leave(kafka_bootstrap, namespace):
    """The invariant run through rebalances, 60 s: overlapping committed holds 0."""
    committed, aborted, overlaps, failures = rebalancing_race(kafka_bootstrap, namespace, 60)
    print(f"rebalancing group race: {committed} committed, {aborted} aborted, {len(overlaps)} overlaps")
    assert failures == []
    assert committed > 200
    assert overlaps == []
