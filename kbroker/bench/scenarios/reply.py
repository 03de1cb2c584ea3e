"""The request-reply scenario: transactional request/reply over C dialogs, kbroker's responder
threads against a hand-written consume-transform-produce loop; throughput and latency."""

from __future__ import annotations

import gc
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kbroker.bench.common import (
    APPROVAL,
    QUEUE,
    REPLY_QUEUE,
    approval_body,
    approval_headers,
    claim_body,
    claim_headers,
    cpu_summary,
    join_all,
    need_transactions,
    new_conversations,
    percentile,
    side_by_side,
)
from kbroker.bench.harness import (
    BASELINE_OVER_KBROKER,
    BenchContext,
    Floor,
    Row,
    Scenario,
    scenario,
)
from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.kafka import clients
from kbroker.kafka.baseline import Delivery, sdk_like_producer, transform_batches
from kbroker.sdk.broker import Broker

# What a responders' factory returns: the threads to start, and how to close what they share.
Responders = tuple[list[threading.Thread], Callable[[], None]]
RR_READERS = 64  # request-reply: kbroker responder threads sharing one Broker (default of --readers)
# request-reply-batched: each of BATCH_READERS threads takes up to BATCH_GROUPS groups per
# transaction, those ready within BATCH_WITHIN s of the first.
BATCH_READERS, BATCH_GROUPS, BATCH_WITHIN = 8, 50, 0.005


# --- request-reply ------------------------------------------------------------------------------


@dataclass
class Tally:
    """Replies committed, the latency of each measured one, and the requester's next sends."""

    warm: set[str]
    total: int
    on_reply: Callable[[str], None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    warm_replies: int = 0
    replies: int = 0
    latencies: list[float] = field(default_factory=list)
    t_last: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    warmed: threading.Event = field(default_factory=threading.Event)

    def committed(self, replied: Iterable[tuple[str, int | None]]) -> None:
        """Called right after a transaction committed replies to (conversation id, request's
        enqueued time in epoch ms)."""
        now_ms, now = time.time() * 1000, time.perf_counter()
        with self.lock:
            for conv, enqueued in replied:
                if conv in self.warm:
                    self.warm_replies += 1
                    if self.warm_replies >= len(self.warm):
                        self.warmed.set()
                    continue
                self.replies += 1
                if enqueued is not None:
                    self.latencies.append(now_ms - enqueued)
                self.t_last = now
                self.on_reply(conv)
            if self.replies >= self.total:
                self.done.set()


class Requester:
    """Employees sending expense claims: at most one request in flight per dialog, the next one
    sent as soon as the previous one's reply committed (closed loop). Requests are written in
    kbroker's wire format by a plain producer, identically for both sides."""

    def __init__(self, cluster: ClusterLike, topic: str, conversations: list[str], total: int, body: bytes):
        self.topic, self.conversations, self.total, self.body = topic, conversations, total, body
        self.seq = {c: 0 for c in conversations}
        self.ready: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.producer = sdk_like_producer(cluster)
        self.delivery = Delivery()
        self.thread = threading.Thread(target=self._run, name="requester", daemon=True)
        self.error: BaseException | None = None

    def request(self, conv: str) -> None:
        self.ready.put(conv)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.ready.put(None)
        self.thread.join(30)
        self.producer.flush(30)

    def _run(self) -> None:
        try:
            while True:
                try:
                    conv = self.ready.get(timeout=0.05)
                except queue.Empty:
                    self.producer.poll(0)
                    continue
                if conv is None:
                    return
                seq = self.seq[conv]
                self.seq[conv] = seq + 1
                self.producer.produce(
                    self.topic, key=conv, value=self.body, headers=claim_headers(conv, seq), on_delivery=self.delivery
                )
                self.producer.poll(0)
                self.delivery.check()
        except BaseException as exc:  # noqa: BLE001 - reported by the scenario
            self.error = exc


def kbroker_responders(
    ctx: BenchContext, namespace: str, tally: Tally, reply: bytes, stop: threading.Event, errors: list[BaseException]
) -> Responders:
    broker = Broker(ctx.cluster, namespace)

    def work() -> None:
        try:
            while not stop.is_set():
                with broker.transaction() as tx:
                    msgs = tx.receive(QUEUE, top=100, wait=0.5)
                    for m in msgs:
                        tx.send(m.conversation_handle, APPROVAL, reply)
                if msgs:  # the transaction committed when the with-block ended
                    tally.committed([(m.conversation_id, m.enqueued_time) for m in msgs])
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=work, name=f"kbroker-responder-{i}", daemon=True) for i in range(ctx.params.readers)
    ]
    return threads, broker.close


def kbroker_batched_responders(
    ctx: BenchContext, namespace: str, tally: Tally, reply: bytes, stop: threading.Event, errors: list[BaseException]
) -> Responders:
    """As kbroker_responders, each transaction holding up to BATCH_GROUPS groups (receive_groups)."""
    broker = Broker(ctx.cluster, namespace)

    def work() -> None:
        try:
            while not stop.is_set():
                with broker.transaction() as tx:
                    batches = tx.receive_groups(QUEUE, BATCH_GROUPS, top=100, wait=0.5, within=BATCH_WITHIN)
                    msgs = [m for batch in batches for m in batch]
                    for m in msgs:
                        tx.send(m.conversation_handle, APPROVAL, reply)
                if msgs:
                    tally.committed([(m.conversation_id, m.enqueued_time) for m in msgs])
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, name=f"kbroker-batched-{i}", daemon=True) for i in range(BATCH_READERS)]
    return threads, broker.close


RESPONDERS = {"kbroker": kbroker_responders, "batched": kbroker_batched_responders}


def baseline_responder(
    ctx: BenchContext, namespace: str, tally: Tally, reply: bytes, stop: threading.Event, errors: list[BaseException]
) -> Responders:
    """A hand-written consume-transform-produce loop: transactional producer, offsets sent to
    the transaction, one commit per 100 records or 100 ms."""
    topic = names.queue_topic(namespace, QUEUE)
    reply_topic = names.queue_topic(namespace, REPLY_QUEUE)

    def work() -> None:
        consumer = clients.consumer(ctx.cluster, f"baseline.{topic}", **{"auto.offset.reset": "earliest"})
        producer = clients.producer(ctx.cluster, **{"transactional.id": f"baseline.{topic}", "linger.ms": 1})
        reply_seq: dict[str, int] = {}

        def transform(rec: Any) -> tuple[str, int]:  # a consumed record
            conv = (rec.key() or b"").decode()
            seq = reply_seq.get(conv, 0)
            reply_seq[conv] = seq + 1
            producer.produce(reply_topic, key=rec.key(), value=reply, headers=approval_headers(conv, seq))
            return conv, rec.timestamp()[1]

        try:
            producer.init_transactions(30)
            consumer.subscribe([topic])
            transform_batches(consumer, producer, transform, tally.committed, lambda: not stop.is_set())
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()
        finally:
            consumer.close()

    return [threading.Thread(target=work, name="baseline-responder", daemon=True)], lambda: None


def measure_request_reply(ctx: BenchContext, side: str) -> dict:
    p = ctx.params
    n, c = p.messages, max(1, min(p.conversations, p.messages))
    ns = ctx.fresh_namespace(f"rr-{side[0]}")
    warm, measured = new_conversations(min(100, c)), new_conversations(c)
    requester = Requester(ctx.cluster, names.queue_topic(ns, QUEUE), warm + measured, n, claim_body(p.body_bytes))
    sent = [0]

    def next_request(conv: str) -> None:  # under the tally's lock
        if sent[0] < n:
            sent[0] += 1
            requester.request(conv)

    tally = Tally(set(warm), n, next_request)
    stop, errors = threading.Event(), list[BaseException]()
    make = RESPONDERS.get(side, baseline_responder)
    threads, close = make(ctx, ns, tally, approval_body(p.body_bytes), stop, errors)
    requester.start()
    for t in threads:
        t.start()
    try:
        ctx.say(f"{side}: warming up on {len(warm)} dialogs")
        for conv in warm:
            requester.request(conv)
        if not _wait(tally.warmed, errors, requester, 120):
            raise RuntimeError(
                f"{side}: warm-up replies did not arrive within 120 s ({tally.warm_replies}/{len(warm)})"
            )
        gc.collect()
        with ctx.reporter.bar(f"{side} request-reply", n) as advance:
            t0, cpu0 = time.perf_counter(), time.process_time()
            with tally.lock:
                for _ in range(p.in_flight):
                    for conv in measured:
                        next_request(conv)
            deadline = 120 + n / 100
            last = 0
            while not tally.done.is_set():
                if not _wait(tally.done, errors, requester, 0.25):
                    if time.perf_counter() - t0 > deadline:
                        raise RuntimeError(f"{side}: only {tally.replies:,} of {n:,} replies after {deadline:.0f} s")
                advance(tally.replies - last)
                last = tally.replies
            elapsed, cpu = tally.t_last - t0, time.process_time() - cpu0
    finally:
        stop.set()
        requester.stop()
        if join_all(threads, 30):
            close()
        else:  # a statement that never returns: closing under it could hang the run too
            ctx.say(f"[yellow]{side}: responder threads did not stop; the connection is left open[/yellow]")
    lat = sorted(tally.latencies)
    return {
        "value": n / elapsed,
        "detail": {
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
            "seconds": elapsed,
            # The process's CPU (every thread, librdkafka's, the requester's and the harness's
            # included, the same for both sides) per reply.
            "cpu_ms_per_msg": round(cpu * 1000 / n, 4),
        },
    }


def _wait(event: threading.Event, errors: list[BaseException], requester: Requester, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if errors:
            raise errors[0]
        if requester.error is not None:
            raise requester.error
        if event.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            return True
    return event.is_set()


def run_request_reply(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    """Both kbroker rows beside one baseline measured in the same repetition: the baseline is the
    same loop for both, and measuring it twice would add a third to the scenario's time."""
    batched = measure_request_reply(ctx, "batched") if rep % 2 else None
    one = side_by_side(rep, lambda side: measure_request_reply(ctx, side))
    batched = batched or measure_request_reply(ctx, "batched")
    return {
        "request-reply": one,
        "request-reply-batched": {
            "kbroker": batched["value"],
            "kbroker_detail": batched["detail"],
            "baseline": one["baseline"],
            "baseline_detail": one["baseline_detail"],
        },
    }


def _cpu_ratio(r: dict) -> float:
    """kbroker's CPU per reply over the baseline's (infinite when either is missing)."""
    k = (r.get("kbroker_detail") or {}).get("cpu_ms_per_msg")
    b = (r.get("baseline_detail") or {}).get("cpu_ms_per_msg")
    return k / b if k and b else float("inf")


def _latency_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}

    def ratio(key: str) -> float | None:
        return float(f"{b[key] / k[key]:.5g}") if k.get(key) and b.get(key) is not None else None

    out["latency_ms"] = {
        "kbroker": {"p50": k.get("p50_ms"), "p99": k.get("p99_ms")},
        "baseline": {"p50": b.get("p50_ms"), "p99": b.get("p99_ms")},
        "ratio_p50": ratio("p50_ms"),
        "ratio_p99": ratio("p99_ms"),
        "ratio_definition": f"{BASELINE_OVER_KBROKER} (above 1: kbroker answers faster)",
    }
    if k or b:
        out["summary"] = "; ".join(
            filter(
                None,
                [
                    f"latency p50/p99 ms: kbroker {k.get('p50_ms')}/{k.get('p99_ms')}, "
                    f"baseline {b.get('p50_ms')}/{b.get('p99_ms')}",
                    cpu_summary(out),
                ],
            )
        )


scenario(
    Scenario(
        name="request-reply",
        description="transactional request/reply over C dialogs: throughput and latency",
        rows=(
            Row(
                "request-reply",
                "msg/s",
                "ratio >= 0.5",
                check=lambda r: r["ratio"] >= 0.5,
                floor=Floor(0.1, cpu=1.5),
                baseline_code="kbroker/bench/scenarios/reply.py:baseline_responder; "
                "kbroker/kafka/baseline.py:transform_batches",
                notes="closed loop, --in-flight claims (default 1) in flight per dialog; kbroker: --readers "
                f"(default {RR_READERS}) threads, each "
                "`with broker.transaction() as tx: tx.receive(top=100)` + tx.send per message; "
                "baseline: consume-transform-produce, transactional producer, "
                "send_offsets_to_transaction, commit every 100 records or 100 ms. Latency = reply "
                "commit - request enqueued; its ratio is baseline/kbroker",
                finish=_latency_summary,
            ),
            Row(
                "request-reply-batched",
                "msg/s",
                "ratio >= 0.5 and CPU per reply <= 2x",
                check=lambda r: r["ratio"] >= 0.5 and _cpu_ratio(r) <= 2,
                floor=Floor(0.2, cpu=0.6),
                baseline_code="kbroker/bench/scenarios/reply.py:baseline_responder; "
                "kbroker/kafka/baseline.py:transform_batches",
                notes=f"as request-reply, kbroker with {BATCH_READERS} threads, each "
                f"`tx.receive_groups(groups={BATCH_GROUPS}, top=100, within={BATCH_WITHIN})` + tx.send per "
                "message, one commit for the groups; the baseline is request-reply's, measured once "
                "in the same repetition",
                finish=_latency_summary,
            ),
        ),
        run=run_request_reply,
        setup=need_transactions,
    )
)
