"""The ended-dialogs scenario: what a namespace with many ended dialogs costs a process that
reads its endpoints, and `kbroker conversations`.

Setup writes the endpoint records of `--ended-dialogs` dialogs whose two sides are CLOSED and
past the grace period (both sides' last records, written an hour ago), and one live dialog, as
a namespace looks after a long run before the worker's reclaim and the broker's compaction have
removed them. Rows:

- ended-dialogs-rss: the peak RSS of a child process that connects, reads every endpoint (what
  the first RECEIVE's partition assignment and the timer service do) and SENDs on the live
  dialog, against a child that only connects. Bounded: the reader keeps no ended endpoint.
- conversations-view: the seconds `kbroker conversations` takes with a worker of the namespace
  running (it keeps the view in memory and answers over its HTTP API), against a plain
  confluent-kafka loop reading the same topic to its end (what any reader of it must at least
  do). The detail also gives the time without a worker (the CLI reads the topic itself).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kbroker.bench.activation import WorkerProcess
from kbroker.bench.common import CLAIM, CONTRACT, EMP, EXP, side_by_side
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.scenarios.rss import PEAK_RSS, RSS_BOUND_MB, run_rss_child
from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.conversation_endpoint import CLOSED, CONVERSING, Endpoint, default_group, handle_for
from kbroker.kafka.baseline import Delivery, fast_producer, read_topic_to_end

VIEW_TARGET_S = 2.0
AGO_S = 3600  # the ended dialogs' records were written an hour ago: past the 30-minute grace

CHILD = (
    r"""
import json, resource, sys, time
mode, cluster, namespace, live, CLAIM = sys.argv[1:6]
import kbroker
t0 = time.monotonic()
broker = kbroker.connect(cluster, namespace)
kept = 0
if mode == "kbroker":
    kept = len(broker.endpoints.all())
    broker.send(live, CLAIM, {"amount": 1})
"""
    + PEAK_RSS
    + r"""
rss_kb = peak_rss_kb()
broker.close()
print(json.dumps({"peak_rss_kb": rss_kb, "endpoints_kept": kept, "seconds": time.monotonic() - t0}))
"""
)


NO_RECLAIM_S = 30 * 24 * 3600  # the bench worker's --closed-grace: longer than the dialogs have been ended


@dataclass
class Ended:
    namespace: str
    dialogs: int
    live: str
    worker: Any = None  # the namespace's worker (activation.WorkerProcess), serving the view


def _ended_pair(conversation_id: str, at: float) -> list[Endpoint]:
    ini = Endpoint(
        handle_for(conversation_id, "INITIATOR"),
        conversation_id,
        "INITIATOR",
        default_group(conversation_id, "INITIATOR"),
        default_group(conversation_id, "TARGET"),
        EMP,
        EXP,
        CONTRACT,
        CLOSED,
        send_sequence=3,
        sequence_reserved=3,
        updated=at,
    )
    tgt = replace(
        ini,
        conversation_handle=handle_for(conversation_id, "TARGET"),
        side="TARGET",
        conversation_group_id=ini.far_conversation_group_id,
        far_conversation_group_id=ini.conversation_group_id,
        service_name=EXP,
        far_service_name=EMP,
        send_sequence=2,
        sequence_reserved=2,
    )
    return [ini, tgt]


def write_ended(cluster: ClusterLike, namespace: str, n: int, advance: Callable[[int], None] = lambda _: None) -> None:
    """Write the endpoint records of `n` dialogs ended AGO_S ago (both sides CLOSED) to the
    namespace's endpoints topic; `advance(k)` after each k written."""
    topic = names.endpoints_topic(namespace)
    producer, delivery = fast_producer(cluster), Delivery()
    at = time.time() - AGO_S
    stamp = int(at * 1000)
    for i in range(n):
        for ep in _ended_pair(str(uuid.uuid4()), at):
            producer.produce(
                topic,
                key=ep.conversation_handle.encode(),
                value=ep.to_json(),
                timestamp=stamp,
                on_delivery=delivery,
            )
        if i % 10_000 == 9_999:
            producer.poll(0)
            advance(10_000)
    advance(n % 10_000)
    delivery.check(producer.flush(600))


def setup_ended(ctx: BenchContext) -> Ended:
    n = ctx.params.ended_dialogs
    ns = ctx.fresh_namespace("ended")
    with ctx.reporter.bar(f"endpoints of {n:,} ended dialogs", n) as advance:
        write_ended(ctx.cluster, ns, n, advance)
    import kbroker

    with kbroker.connect(ctx.cluster, ns) as b:
        live = b.begin_dialog(EMP, EXP, CONTRACT)
        b.send(live, CLAIM, {"amount": 0})
        assert b.endpoints.get(live).state == CONVERSING
    return Ended(ns, n, live)


def run_ended(ctx: BenchContext, ended: Ended, rep: int) -> dict[str, dict]:
    from kbroker.kafka.queue_views import conversation_view
    from kbroker.worker.web.views import worker_conversations

    rss = side_by_side(
        rep,
        lambda side: run_rss_child(
            CHILD, [ctx.cluster.bootstrap, ended.namespace, ended.live, CLAIM], side, timeout=900
        ),
    )
    rss["ended_dialogs"] = ended.dialogs

    def read_view(side: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        if side == "kbroker":
            rows = worker_conversations(url, ended.namespace, timeout=60)
            if rows is None:
                raise RuntimeError(f"the worker did not answer for its view: {worker.tail()}")
            detail: dict[str, Any] = {"rows": len(rows), "served_by": "worker"}
        else:
            detail = {"records": read_topic_to_end(ctx.cluster, names.endpoints_topic(ended.namespace))}
        return {"value": time.perf_counter() - t0, "detail": detail}

    worker = ended.worker
    if worker is None:
        # The namespace is one whose ended dialogs the worker has not reclaimed yet: with its
        # 30-minute grace, the worker's 5th-tick cleanup would tombstone all of them during the
        # run (2,000,000 more records), and every later repetition would read another topic.
        worker = ended.worker = WorkerProcess(
            ctx, ended.namespace, ramp_up=1.0, handlers=1, extra=("--closed-grace", str(NO_RECLAIM_S))
        )
    url = f"http://127.0.0.1:{worker.port}"
    deadline = time.monotonic() + 900
    ctx.say("waiting for the worker's first read of the endpoints topic")
    while worker_conversations(url, ended.namespace, timeout=5) is None:
        worker.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker's view did not come up in 900 s: {worker.tail()}")
        time.sleep(1.0)
    view = side_by_side(rep, read_view)
    t0 = time.perf_counter()
    without = len(conversation_view(ctx.cluster, ended.namespace))
    view["kbroker_detail"]["without_worker_s"] = round(time.perf_counter() - t0, 2)
    view["kbroker_detail"]["without_worker_rows"] = without
    view["ended_dialogs"] = ended.dialogs
    return {"ended-dialogs-rss": rss, "conversations-view": view}


def teardown_ended(ctx: BenchContext, ended: Ended) -> None:
    if ended.worker is not None:
        ended.worker.stop()


scenario(
    Scenario(
        name="ended-dialogs",
        description="a process reading the endpoints of many ended dialogs, and `kbroker conversations`",
        rows=(
            Row(
                "ended-dialogs-rss",
                "MB",
                f"bounded: <= baseline + {RSS_BOUND_MB} MB",
                check=lambda r: r["kbroker"] - r["baseline"] <= RSS_BOUND_MB,
                floor=Floor(2 * RSS_BOUND_MB, "growth", at_most=True),
                baseline_code='kbroker/bench/scenarios/endpoints.py:CHILD (mode "baseline": connect only)',
                notes="child process: connect, read every endpoint, SEND on the live dialog; peak RSS (VmHWM) "
                "vs a child that only connects; the ended dialogs' records are past the grace period",
            ),
            Row(
                "conversations-view",
                "s",
                f"<= {VIEW_TARGET_S:g} s",
                check=lambda r: r["kbroker"] <= VIEW_TARGET_S,
                floor=Floor(5 * VIEW_TARGET_S, "kbroker", at_most=True),
                baseline_code="kbroker/kafka/baseline.py:read_topic_to_end",
                notes="kbroker conversations with the namespace's worker running (it keeps the view in memory) "
                "vs a plain consumer reading the endpoints topic to its end; without a worker the CLI "
                "reads the topic itself (detail: without_worker_s)",
            ),
        ),
        run=run_ended,
        setup=setup_ended,
        teardown=teardown_ended,
    )
)
