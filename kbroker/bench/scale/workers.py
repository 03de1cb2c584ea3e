"""`kbroker bench scale`, the worker curve: W `kbroker worker` processes sharing one namespace of
8 activated queues, each queue's readers running an I/O-bound procedure (5 ms per message,
procedures.drain_io; max_queue_readers 2).

A queue's monitor, and so its activated readers, lives on the worker that holds the queue's
partition of the monitor-events topic. The namespace's first worker makes that topic with 8
partitions (`--monitor-partitions`), and the queues are named so that each has a partition of its
own (names hash to partitions, and the first 8 numbers would share 6), so that W workers of 1 to
8 own 8 / W monitors each and the curve measures the workers rather than the names' hashes. Per
W: the backlog's drain rate, from ALTER QUEUE ... ACTIVATION ON on every queue until every queue
group's committed offsets reach the end; how many workers owned monitors; the workers' RSS and
CPU seconds over the drain.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from kbroker.bench.activation import WorkerProcess, monitor_rows_of
from kbroker.bench.context import BenchContext
from kbroker.bench.scale.many_queues import CONTRACT, INITIATOR, MESSAGE, apply_queues, queue_name
from kbroker.bench.scenarios.activation_drain import CommitWatch
from kbroker.kafka.queue_views import alter_queue_activation
from kbroker.worker.settings import monitor_partition

QUEUES = 8
MONITOR_PARTITIONS = QUEUES  # one queue's monitor per partition (NUMBERS)
MAX_READERS = 2
PROCEDURE = "kbroker.bench.procedures:drain_io"
HANDLERS = 4  # task handler threads per worker: 2 x CPUs, the default, on a 2-core machine


def one_per_partition(queues: int, partitions: int) -> list[int]:
    """The first numbers i whose queue_name(i) falls on a monitor partition none before took."""
    taken: dict[int, int] = {}
    i = 0
    while len(taken) < min(queues, partitions):
        taken.setdefault(monitor_partition(queue_name(i), partitions), i)
        i += 1
    return sorted(taken.values())


NUMBERS = one_per_partition(QUEUES, MONITOR_PARTITIONS)
NAMES = [queue_name(i) for i in NUMBERS]


def settle(workers: list[WorkerProcess], quiet: float = 5.0, timeout: float = 180.0) -> dict[str, str]:
    """Wait until every queue's monitor has a row and no row changed owner for `quiet` s;
    returns queue -> owning worker."""
    deadline, since = time.monotonic() + timeout, time.monotonic()
    owners: dict[str, str] = {}
    while time.monotonic() < deadline:
        for w in workers:
            w.check()
        rows = monitor_rows_of(workers[0])
        now = {q: str(r.get("worker")) for q, r in rows.items() if q.startswith("Q")}
        if now != owners:
            owners, since = now, time.monotonic()
        elif len(now) == QUEUES and time.monotonic() - since >= quiet:
            return owners
        time.sleep(0.5)
    raise RuntimeError(f"the monitors did not settle within {timeout:.0f} s: {owners}")


def activation_all(ctx: BenchContext, ns: str, workers: list[WorkerProcess], status: str) -> None:
    for queue in NAMES:
        alter_queue_activation(ctx.cluster, ns, queue, status=status)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = monitor_rows_of(workers[0])
        if sum(1 for q, r in rows.items() if q.startswith("Q") and r["activation"] == status) == QUEUES:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the monitors did not show ACTIVATION {status} within 60 s")


def backlog(ctx: BenchContext, ns: str, messages: int) -> None:
    """`messages` spread over the queues, 50 dialogs each, SENT 1,000 per transaction."""
    from kbroker.sdk.broker import Broker

    broker = Broker(ctx.cluster, ns)
    try:
        handles = [broker.begin_dialog(INITIATOR, f"//scale/{NAMES[i % QUEUES]}", CONTRACT) for i in range(50 * QUEUES)]
        with ctx.reporter.bar(f"workers: a backlog of {messages:,}", messages) as advance:
            for start in range(0, messages, 1000):
                with broker.transaction() as tx:
                    for i in range(start, min(messages, start + 1000)):
                        tx.send(handles[i % len(handles)], MESSAGE, b"{}")
                advance(min(1000, messages - start))
    finally:
        broker.close()


def drained_target(watches: list[CommitWatch]) -> int:
    """Where the queue groups are done: each partition's end offset less one, the marker of the
    last transaction that wrote to it (every backlog record was SENT in a transaction), which a
    committed offset never passes."""
    return sum(max(0, e - 1) for w in watches for e in w.ends().values())


def cpu_seconds(workers: list[WorkerProcess]) -> float:
    total = 0.0
    for w in workers:
        t = psutil.Process(w.proc.pid).cpu_times()
        total += t.user + t.system
    return total


def measure(ctx: BenchContext, w: int, *, messages: int = 10_000) -> dict[str, Any]:
    """One point of the worker curve (see the module docstring)."""
    ns, _ = apply_queues(ctx, QUEUES, 4, tag="w", procedure=PROCEDURE, max_readers=MAX_READERS, numbers=NUMBERS)
    ctx.say(f"workers: starting {w} worker(s) on {QUEUES} queues")
    workers: list[WorkerProcess] = []
    watches: list[CommitWatch] = []
    try:
        spread = ("--monitor-partitions", str(MONITOR_PARTITIONS))
        workers = [
            WorkerProcess(ctx, ns, ramp_up=ctx.params.ramp_up, handlers=HANDLERS, extra=spread) for _ in range(w)
        ]
        owners = settle(workers)
        activation_all(ctx, ns, workers, "OFF")
        backlog(ctx, ns, messages)
        watches = [CommitWatch(ctx, ns, queue) for queue in NAMES]
        target, start = drained_target(watches), sum(x.done() for x in watches)
        cpu0, t0 = cpu_seconds(workers), time.perf_counter()
        activation_all(ctx, ns, workers, "ON")
        deadline = t0 + 120 + messages / 50
        with ctx.reporter.bar(f"workers: {w} draining", target - start) as advance:
            last = start
            while (done := sum(x.done() for x in watches)) < target:
                advance(done - last)
                last = done
                for x in workers:
                    x.check()
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{done - start:,} of {target - start:,} drained by {w} workers")
                time.sleep(0.1)
            advance(done - last)
        seconds = time.perf_counter() - t0
        rss = [psutil.Process(x.proc.pid).memory_info().rss / 2**20 for x in workers]
        return {
            "workers": w,
            "queues": QUEUES,
            "messages": messages,
            "seconds": round(seconds, 2),
            "msg_per_s": round(messages / seconds, 1),
            "monitor_owners": len(set(owners.values())),
            "worker_rss_mb": round(sum(rss) / len(rss), 1),
            "cpu_s_per_1000_msg": round((cpu_seconds(workers) - cpu0) * 1000 / messages, 3),
        }
    finally:
        for watch in watches:
            watch.close()
        for x in workers:
            x.stop()
