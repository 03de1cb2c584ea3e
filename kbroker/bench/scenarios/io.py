"""The io-bound scenario: a handler awaiting I/O per message, kbroker's reader threads against
what a Kafka user would write for it (a worker thread per partition, bench/partition_workers.py),
and, as an extra row, against one consumer handling every record in turn."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

from kbroker.bench import io_processes
from kbroker.bench.common import (
    IO_DELAY,
    QUEUE,
    claim_body,
    join_all,
    need_transactions,
    new_conversations,
    produce_dialogs,
    side_by_side,
)
from kbroker.bench.harness import (
    BenchContext,
    Floor,
    Row,
    Scenario,
    scenario,
)
from kbroker.bench.partition_workers import Clock, baseline_partition_workers
from kbroker.bench.usage import measured_with_usage
from kbroker.core import names
from kbroker.kafka import clients
from kbroker.sdk.broker import Broker

# io-bound: kbroker reader threads sharing one Broker (its receiver and group commit). A reader
# spends a RECEIVE, 2 x 5 ms of handler and a group commit (5-20 ms) per dialog, so its share is
# ~60 msg/s: 32 readers held the row near 2,000 msg/s whatever the CPU. 256 cost ~100 MB of RSS
# more than 32 (thread stacks) and moved the bound to the process's CPU (~0.2 ms per message,
# the GIL's one core): measured on a loaded 2-core machine, 256 threads were 3x 32, and asyncio
# readers (kbroker.aio, 256 coroutines on 64-128 threads) no better than threads.
IO_READERS = 256
# io-bound-processes: the same 256 readers spread over N processes (bench/io_processes.py), for
# when one process's Python (one core) is the bound. More than the queue's 4 partitions would idle.
IO_PROCESSES = (2, 4)
# io-bound-batched: each reader takes up to IO_BATCH_GROUPS groups per transaction, one commit for
# them. The handler's 5 ms a message then holds that many groups at once; at 10,000 messages 2, 4
# and 8 gave 1.2-1.46x the one-group form, 16 no more, so 4 keeps the locks short.
IO_BATCH_GROUPS = 4


# --- io-bound -------------------------------------------------------------------------------------


@dataclass
class _Handled:
    """Messages handled so far, and when the first was received and the last handled."""

    done: int = 0
    first: float | None = None
    last: float | None = None


def measure_io_bound(ctx: BenchContext, side: str) -> dict:
    """One side's rate, its detail with the side's CPU time and peak RSS (bench/usage.py)."""
    return measured_with_usage(_measure_io_bound, ctx, side)


def _measure_io_bound(ctx: BenchContext, side: str) -> dict:
    c = ctx.params.conversations
    total = 2 * c
    ns = ctx.fresh_namespace(f"io-{side[0]}")
    produce_dialogs(
        ctx,
        names.queue_topic(ns, QUEUE),
        new_conversations(c),
        2,
        claim_body(ctx.params.body_bytes),
        f"{side}: {total:,} messages on {c:,} dialogs",
    )
    lock = threading.Lock()
    state = _Handled()
    deadline = time.monotonic() + 60 + total * IO_DELAY * 1.5
    gc.collect()
    t_start = time.perf_counter()

    def handled(n: int, first_at: float) -> None:
        with lock:
            state.done += n
            state.first = first_at if state.first is None else min(state.first, first_at)
            state.last = time.perf_counter()

    if side in ("kbroker", "batched"):
        groups = IO_BATCH_GROUPS if side == "batched" else 1
        broker = Broker(ctx.cluster, ns)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                while state.done < total and time.monotonic() < deadline:
                    with broker.transaction() as tx:
                        msgs = [m for b in tx.receive_groups(QUEUE, groups, top=10, wait=1) for m in b]
                        got = time.perf_counter()
                        for _ in msgs:
                            time.sleep(IO_DELAY)
                    if msgs:
                        handled(len(msgs), got)
            except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, name=f"io-reader-{i}", daemon=True) for i in range(IO_READERS)]
        try:
            with ctx.reporter.bar(f"kbroker, {IO_READERS} readers", total) as advance:
                for t in threads:
                    t.start()
                last = 0
                # Readers check the deadline between RECEIVEs; one that never returns is given up.
                while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 30:
                    time.sleep(0.25)
                    advance(state.done - last)
                    last = state.done
            if errors:
                raise errors[0]
        finally:
            if join_all(threads, 5):
                broker.close()
            else:
                ctx.say("[yellow]kbroker: reader threads did not stop; the connection is left open[/yellow]")
    elif side == "baseline":
        clock = Clock()
        baseline_partition_workers(ctx, names.queue_topic(ns, QUEUE), total, clock, deadline)
        return {"value": clock.rate(total), "detail": clock.detail(total, t_start)}
    else:  # serial: one consumer handling every record in turn
        consumer = clients.consumer(
            ctx.cluster, f"baseline.{names.queue_topic(ns, QUEUE)}", **{"auto.offset.reset": "earliest"}
        )
        try:
            consumer.subscribe([names.queue_topic(ns, QUEUE)])
            with ctx.reporter.bar("serial baseline, one consumer in partition order", total) as advance:
                while state.done < total and time.monotonic() < deadline:
                    recs = [r for r in consumer.consume(100, 1.0) if not r.error()]
                    got = time.perf_counter()
                    for _ in recs:
                        time.sleep(IO_DELAY)
                    if recs:
                        consumer.commit(asynchronous=False)
                        handled(len(recs), got)
                        advance(len(recs))
        finally:
            consumer.close()
    if state.done < total:
        raise RuntimeError(f"{side}: only {state.done:,} of {total:,} messages handled in time")
    assert state.first is not None and state.last is not None  # something was handled
    elapsed = state.last - state.first
    return {"value": total / elapsed, "detail": {"seconds": elapsed, "wall_seconds": state.last - t_start}}


def measure_processes(ctx: BenchContext, n: int) -> dict:
    """io-bound's kbroker reader as `n` processes of IO_READERS / n threads each."""
    c = ctx.params.conversations
    ns = ctx.fresh_namespace(f"io-p{n}")
    return io_processes.measure_processes(
        ctx.cluster,
        ns,
        n,
        IO_READERS // n,
        2 * c,
        lambda: produce_dialogs(
            ctx,
            names.queue_topic(ns, QUEUE),
            new_conversations(c),
            2,
            claim_body(ctx.params.body_bytes),
            f"{n} processes: {2 * c:,} messages on {c:,} dialogs",
        ),
        time.monotonic() + 120 + 2 * c * IO_DELAY * 1.5,
    )


def run_io_bound(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    row = side_by_side(rep, lambda side: measure_io_bound(ctx, side))
    serial = measure_io_bound(ctx, "serial")
    batched = measure_io_bound(ctx, "batched")
    out = {
        "io-bound": row,
        "io-bound-batched": {
            "kbroker": batched["value"],
            "kbroker_detail": batched["detail"],
            "baseline": row["baseline"],
            "baseline_detail": row["baseline_detail"],
        },
        "io-bound-serial": {
            "kbroker": row["kbroker"],
            "baseline": serial["value"],
            "baseline_detail": serial["detail"],
        },
    }
    for n in IO_PROCESSES:  # against the partition-parallel baseline of the same repetition
        m = measure_processes(ctx, n)
        ctx.say(f"io-bound, {n} processes: {m['value']:,.0f} msg/s, {m['detail']}")
        out[f"io-bound-{n}-processes"] = {
            "kbroker": m["value"],
            "kbroker_detail": m["detail"],
            "baseline": row["baseline"],
            "baseline_detail": row["baseline_detail"],
        }
    return out


scenario(
    Scenario(
        name="io-bound",
        description=f"handler awaiting {IO_DELAY * 1000:.0f} ms per message, C dialogs x 2 messages",
        rows=(
            Row(
                "io-bound",
                "msg/s",
                "ratio >= 10",
                check=lambda r: r["ratio"] >= 10,
                floor=Floor(1.0),
                baseline_code="kbroker/bench/partition_workers.py:baseline_partition_workers",
                notes=f"C dialogs x 2 messages preloaded on ExpenseQueue (4 partitions), a handler taking "
                f"{IO_DELAY * 1000:.0f} ms per message; kbroker: {IO_READERS} threads, each `with "
                "broker.transaction() as tx: tx.receive(top=10, wait=1)`; baseline: one consumer, a "
                "worker thread per partition handling its records in order, offsets committed every "
                "100 ms (bench/partition_workers.py). Timed from the first message handed out to the "
                "last one handled (consumer start-up excluded on both sides); each side's detail has its CPU "
                "seconds and peak RSS (start-up included, bench/usage.py)",
            ),
            Row(
                "io-bound-batched",
                "msg/s",
                "ratio >= 10",
                check=lambda r: r["ratio"] >= 10,
                floor=Floor(1.0),
                baseline_code="kbroker/bench/partition_workers.py:baseline_partition_workers (io-bound's)",
                notes=f"as io-bound, each of the {IO_READERS} threads taking up to {IO_BATCH_GROUPS} groups "
                f"per transaction (`tx.receive_groups(groups={IO_BATCH_GROUPS}, top=10, wait=1)`), one "
                "commit for them; baseline = io-bound's of the same repetition",
            ),
            *(
                Row(
                    f"io-bound-{n}-processes",
                    "msg/s",
                    None,
                    baseline_code="kbroker/bench/partition_workers.py:baseline_partition_workers (io-bound's)",
                    notes=f"informational: kbroker = the io-bound reader as {n} processes of {IO_READERS // n} "
                    "threads on one machine (bench/io_processes.py), the messages written once every "
                    "process owns a partition, timed from the first message handled to the last "
                    "committed; detail: the processes' CPU seconds and peak RSS each; baseline = "
                    "io-bound's partition-parallel baseline of the same repetition",
                )
                for n in IO_PROCESSES
            ),
            Row(
                "io-bound-serial",
                "msg/s",
                None,
                baseline_code='kbroker/bench/scenarios/io.py:measure_io_bound (side "serial")',
                notes="informational: kbroker = io-bound's kbroker figure of the same repetition; baseline "
                "= one consumer handling every record in turn, committing after each batch (what the "
                "io-bound row compared with before it had the partition-parallel baseline)",
            ),
        ),
        run=run_io_bound,
        setup=need_transactions,
    )
)
