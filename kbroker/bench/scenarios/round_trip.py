"""The round-trip scenario: a dialog's round trip at low load, one dialog and ten. kbroker: SEND
(acknowledged), the far side's RECEIVE + SEND in one transaction, the requester's RECEIVE (a
transaction of its own); against the same exchange through a plain exactly-once loop."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from kbroker.bench.common import (
    APPROVAL,
    CLAIM,
    CONTRACT,
    EMP,
    EXP,
    QUEUE,
    REPLY_QUEUE,
    approval_body,
    claim_body,
    details,
    join_all,
    need_transactions,
    percentile,
    side_by_side,
)
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.core import names
from kbroker.kafka import clients
from kbroker.kafka.baseline import sdk_like_producer
from kbroker.sdk.broker import Broker

ROUND_TRIPS = 500  # measured round trips per side and repetition (after WARM_UP)
WARM_UP = 20
DIALOGS = (1, 10)
P50_RATIO, FLOOR_RATIO = 1.5, 6.0


class Loop:
    """A closed loop over its dialogs: each gets its next request once its reply is in, the round
    trip timed from before the request's send to the reply's removal; the first WARM_UP replies
    are not timed."""

    def __init__(self) -> None:
        self.total = WARM_UP + ROUND_TRIPS
        self.sent_at: dict[str, float] = {}
        self.rtts: list[float] = []
        self.sent = self.done = 0

    def sending(self, key: str) -> None:
        self.sent += 1
        self.sent_at[key] = time.perf_counter()

    def replied(self, key: str) -> bool:
        """One reply on `key` removed; True when another request should go out on it."""
        self.done += 1
        if self.done > WARM_UP:
            self.rtts.append((time.perf_counter() - self.sent_at[key]) * 1000)
        return self.sent < self.total


def _kbroker(ctx: BenchContext, dialogs: int) -> list[float]:
    ns = ctx.fresh_namespace("rt-k")
    requester, responder = Broker(ctx.cluster, ns), Broker(ctx.cluster, ns)
    stop, errors = threading.Event(), list[BaseException]()
    reply = approval_body(ctx.params.body_bytes)

    def respond() -> None:
        try:
            while not stop.is_set():
                with responder.transaction() as tx:
                    for group in tx.receive_groups(QUEUE, groups=DIALOGS[-1], top=10, wait=0.5):
                        for m in group:
                            tx.send(m.conversation_handle, APPROVAL, reply)
        except BaseException as exc:  # noqa: BLE001 - raised again below
            errors.append(exc)

    thread = threading.Thread(target=respond, name="round-trip-responder", daemon=True)
    thread.start()
    loop, body = Loop(), claim_body(ctx.params.body_bytes)
    try:
        handles = [requester.begin_dialog(EMP, EXP, CONTRACT) for _ in range(dialogs)]

        def send(h: str) -> None:
            loop.sending(h)
            requester.send(h, CLAIM, body)

        for h in handles:
            send(h)
        while loop.done < loop.total:
            got = requester.receive(REPLY_QUEUE, wait=30)  # a transaction of its own: removed on return
            if not got:
                raise RuntimeError(errors[0] if errors else "kbroker: no reply within 30 s")
            h = got[0].conversation_handle
            if loop.replied(h):
                send(h)
    finally:
        stop.set()
        if join_all([thread], 30):
            responder.close()
        requester.close()
    if errors:
        raise errors[0]
    return loop.rtts


def soon(consumer: Any, most: int) -> list[Any]:
    """Up to `most` records, returned as soon as one is there (at most 50 ms): Consumer.consume
    alone waits out its time-out unless `most` records come, which would add it to each hop."""
    got = consumer.consume(most, 0)
    if not got:
        got = consumer.consume(1, 0.05)
        if got and most > 1:
            got += consumer.consume(most - 1, 0)
    return got


def _baseline(ctx: BenchContext, dialogs: int) -> list[float]:
    """What a Kafka user writes for it: the request produced and acknowledged (the SEND's
    settings); the far side a transactional consume-transform-produce loop committing each poll's
    records at once; the requester's reply consumer (read_committed) committing each reply's
    offset synchronously before it counts."""
    ns = ctx.fresh_namespace("rt-b")
    topic, reply_topic = names.queue_topic(ns, QUEUE), names.queue_topic(ns, REPLY_QUEUE)
    stop, errors = threading.Event(), list[BaseException]()
    reply = approval_body(ctx.params.body_bytes)
    ready = threading.Event()

    def respond() -> None:
        consumer = clients.consumer(ctx.cluster, f"baseline.{topic}", **{"auto.offset.reset": "earliest"})
        producer = clients.producer(  # the back-off tuned as kbroker's: CONCURRENT_TRANSACTIONS after a commit
            ctx.cluster,
            **{
                "transactional.id": f"baseline.{topic}",
                "linger.ms": 0,
                "retry.backoff.ms": 1,
                "retry.backoff.max.ms": 5,
            },
        )
        try:
            producer.init_transactions(30)
            consumer.subscribe([topic], on_assign=lambda *_: ready.set())
            while not stop.is_set():
                recs = [r for r in soon(consumer, 100) if not r.error()]
                if not recs:
                    continue
                producer.begin_transaction()
                for r in recs:
                    producer.produce(reply_topic, key=r.key(), value=reply)
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
                )
                producer.commit_transaction(30)
        except BaseException as exc:  # noqa: BLE001 - raised again below
            errors.append(exc)
        finally:
            consumer.close()

    thread = threading.Thread(target=respond, name="round-trip-baseline", daemon=True)
    thread.start()
    producer = sdk_like_producer(ctx.cluster)
    replies = clients.consumer(ctx.cluster, f"baseline.{reply_topic}", **{"auto.offset.reset": "earliest"})
    loop, body = Loop(), claim_body(ctx.params.body_bytes)
    try:
        replies.subscribe([reply_topic])
        replies.consume(1, 0.5)  # joins the group before the clock starts
        if not ready.wait(30):
            raise RuntimeError(errors[0] if errors else "baseline: the responder was given no partition in 30 s")

        def send(key: str) -> None:
            loop.sending(key)
            producer.produce(topic, key=key, value=body)
            producer.flush(30)

        for i in range(dialogs):
            send(f"dialog-{i}")
        deadline = time.monotonic() + 60 + ROUND_TRIPS
        while loop.done < loop.total:
            if errors or time.monotonic() > deadline:
                raise RuntimeError(errors[0] if errors else "baseline: replies stopped coming")
            for r in soon(replies, 10):
                if r.error():
                    continue
                replies.commit(message=r, asynchronous=False)  # removed: what RECEIVE's commit does
                key = (r.key() or b"").decode()
                if loop.replied(key):
                    send(key)
    finally:
        stop.set()
        join_all([thread], 30)
        replies.close()
    if errors:
        raise errors[0]
    return loop.rtts


SIDES: dict[str, Callable[[BenchContext, int], list[float]]] = {"kbroker": _kbroker, "baseline": _baseline}


def measure(ctx: BenchContext, side: str, dialogs: int) -> dict[str, Any]:
    gc.collect()
    rtts = sorted(SIDES[side](ctx, dialogs))
    return {
        "value": percentile(rtts, 50),
        "detail": {"p50_ms": percentile(rtts, 50), "p99_ms": percentile(rtts, 99), "round_trips": len(rtts)},
    }


def run_round_trip(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    return {row(d): side_by_side(rep, lambda side, d=d: measure(ctx, side, d)) for d in DIALOGS}  # type: ignore[misc]


def row(dialogs: int) -> str:
    return "round-trip" if dialogs == 1 else f"round-trip-{dialogs}-dialogs"


def _p99_no_worse(r: dict) -> bool:
    k, b = details(r)
    return k.get("p99_ms") is not None and b.get("p99_ms") is not None and k["p99_ms"] <= b["p99_ms"]


def _summary(out: dict) -> None:
    k, b = details(out)
    if k or b:
        out["summary"] = (
            f"round trip p50/p99 ms: kbroker {k.get('p50_ms')}/{k.get('p99_ms')}, "
            f"baseline {b.get('p50_ms')}/{b.get('p99_ms')}"
        )


scenario(
    Scenario(
        name="round-trip",
        description="a dialog's round trip at low load, one dialog and ten",
        rows=tuple(
            Row(
                row(d),
                "ms (p50)",
                f"ratio <= {P50_RATIO:g} and p99 <= the baseline's",
                check=lambda r: r["ratio"] <= P50_RATIO and _p99_no_worse(r),
                floor=Floor(FLOOR_RATIO, at_most=True),
                baseline_code="kbroker/bench/scenarios/round_trip.py:_baseline",
                notes=f"{d} dialog(s), one request in flight on each, {ROUND_TRIPS} round trips after "
                f"{WARM_UP}; kbroker: broker.send, a responder thread's `with broker.transaction() as tx: "
                "tx.receive_groups(groups=10, top=10)` + tx.send, the requester's broker.receive (a transaction of its own); "
                "baseline: an acknowledged produce, a transactional consume-transform-produce loop "
                "committing each poll's records, a read_committed reply consumer committing each "
                "reply synchronously. Value: the round trip's p50; lower is better",
                finish=_summary,
            )
            for d in DIALOGS
        ),
        run=run_round_trip,
        setup=need_transactions,
    )
)
