"""The transport-delayed scenario: how late the transport face's delayed delivery
(`TransportEndpoint.send(..., not_before=)`, core/transport/delayed.py) hands a message over,
against a plain Kafka scheduler doing the same job on the same broker at the same time.

N messages (`--delayed-messages`) are due at times spread uniformly at random over a window
(`--delayed-seconds`) that starts LEAD after the run begins. Both sides' messages are written
first, as fast as they go (kbroker: endpoint Sales, many `tx.send(..., not_before=)` per
transaction; baseline: a fast producer to a plain topic), with the same due times; then both
sides run over the same window, side by side:

    kbroker   Sales started (its DelayedMover reads its delayed store and moves each due row
              to Billing, in Kafka transactions); Billing started with a handler that records
              now - due per message (the due time travels in header `bench.due`)
    baseline  a plain consumer reading the plain topic into a heap, producing each record to a
              destination topic with an idempotent producer when due (no transactions), and a
              plain consumer of the destination recording now - due the same way

The row is each side's lateness p99 (ms). Each destination is then read whole (read_committed):
a message missing or there twice is an error, not a figure. Running the sides at the same time
halves a repetition (a full one is LEAD + 600 s) and puts both on the same machine noise; they
share the process, so each side's CPU spikes (the mover's reads of its store) reach the other."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
import uuid
from typing import Any

from kbroker.bench.common import percentile
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.scenarios.transport import HEADERS, order_body, transport_record
from kbroker.core.transport.endpoint import PRIMARY_PARTITIONS, InstallPlan, transport_queue_topic
from kbroker.core.transport.message import TransportMessage
from kbroker.kafka import clients, messages
from kbroker.kafka.baseline import Delivery, fast_producer, is_partition_eof
from kbroker.kafka.clients import produce
from kbroker.kafka.transport.delayed_store import INTERVAL
from kbroker.kafka.transport.queues import install
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.transaction import TransportTransaction

SENDER, BILLING = "Sales", "Billing"
STORE, DESTINATION = "Delayed", "Destination"  # the baseline's plain topics (4 partitions each)
DUE = "bench.due"  # the due time, epoch ms, as text: a header of the message (kbroker) or record (baseline)
PER_TRANSACTION = 1000  # kbroker's delayed sends per transaction
TARGET_MS = (INTERVAL + 1.0) * 1000  # the mover's interval (1 s) and a second
# The window starts this long after the run begins: both sides' sends, the endpoints' start and
# the mover's first read of its store come before the first message is due.
LEAD_BASE, LEAD_PER_MESSAGE = 10.0, 0.0003
SAMPLE_EVERY = 0.25  # seconds between samples of the mover's stats


class Lateness:
    """Per message id, the first arrival's lateness (ms); arrivals after the first counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ms: dict[str, float] = {}
        self.again = 0

    def arrived(self, mid: str, due_ms: int) -> None:
        late = time.time() * 1000 - due_ms
        with self._lock:
            if mid in self.ms:
                self.again += 1
            else:
                self.ms[mid] = late

    def __len__(self) -> int:
        return len(self.ms)

    def detail(self) -> dict[str, Any]:
        values = list(self.ms.values())
        return {
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "max_ms": max(values) if values else None,
            "early": sum(1 for v in values if v < 0),  # handed over before they were due: a bug
        }


def due_times(n: int, base_ms: int, window: float, seed: int) -> list[int]:
    """`n` due times (epoch ms) uniformly at random over [base, base + window], in send order."""
    rng = random.Random(seed)
    return [base_ms + int(rng.uniform(0, window * 1000)) for _ in range(n)]


def due_of(rec: Any) -> int:  # a consumed record
    """A baseline record's due time (epoch ms), from its header."""
    raw = dict(rec.headers() or [])[DUE]
    return int(raw.decode() if isinstance(raw, bytes) else str(raw))


def read_ids(ctx: BenchContext, topic: str, timeout: float = 120.0) -> list[str]:
    """The keys (message Ids) of every committed record of `topic` (PRIMARY_PARTITIONS
    partitions), read from its start to its end by a consumer of a group of its own."""
    consumer = clients.consumer(
        ctx.cluster,
        f"bench.ids.{topic}.{uuid.uuid4().hex[:8]}",
        **{"enable.partition.eof": True, "auto.offset.reset": "earliest"},
    )
    try:
        consumer.subscribe([topic])
        ends: set[int] = set()
        ids, deadline = [], time.monotonic() + timeout
        while len(ends) < PRIMARY_PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.05):
                if is_partition_eof(msg):
                    ends.add(messages.partition(msg))
                elif msg.error() is None:
                    ids.append((msg.key() or b"").decode())
        if len(ends) < PRIMARY_PARTITIONS:
            raise RuntimeError(f"{topic} not read to its end in {timeout:g} s")
        return ids
    finally:
        consumer.close()


def delivered(expected: set[str], ids: list[str]) -> dict[str, int]:
    """What reached a destination: moved (records there), lost (expected, not there) and
    duplicated (there more than once)."""
    distinct = set(ids)
    return {"moved": len(ids), "lost": len(expected - distinct), "duplicated": len(ids) - len(distinct)}


# --- kbroker ----------------------------------------------------------------------------------


class KBrokerSide:
    """Sales's delayed sends to Billing, then Sales (its mover) and Billing (recording) started."""

    def __init__(self, ctx: BenchContext, tag: str):
        self.ctx = ctx
        self.ns = f"bench-{tag}-{uuid.uuid4().hex[:8]}"[:40]
        ctx.namespaces.append(self.ns)
        for endpoint in (SENDER, BILLING):  # each with its delayed store, as the installer creates them
            install(ctx.cluster, self.ns, InstallPlan(((endpoint, PRIMARY_PARTITIONS),), delayed=endpoint))
        self.sales = TransportEndpoint(SENDER, cluster=ctx.cluster, namespace=self.ns, secondary=False)
        self.billing = TransportEndpoint(BILLING, cluster=ctx.cluster, namespace=self.ns, secondary=False)
        self.lateness = Lateness()
        self.ids: set[str] = set()
        self.peak = {"held": 0, "held_bytes": 0}
        self._closed = False

    def send(self, dues: list[int], body: bytes) -> float:
        """Every delayed send, PER_TRANSACTION in each transaction; returns the seconds taken."""
        n = len(dues)
        t0 = time.perf_counter()
        with self.ctx.reporter.bar(f"kbroker: {n:,} delayed sends, {PER_TRANSACTION:,} a transaction", n) as advance:
            for start in range(0, n, PER_TRANSACTION):
                chunk = dues[start : start + PER_TRANSACTION]
                with self.sales.transaction() as tx:
                    for due in chunk:
                        headers = {**HEADERS, DUE: str(due)}
                        self.ids.add(tx.send(BILLING, body, headers, not_before=due / 1000))
                advance(len(chunk))
        return time.perf_counter() - t0

    def start(self) -> None:
        def record(msg: TransportMessage, _tx: TransportTransaction) -> None:
            self.lateness.arrived(msg.id, int(msg.headers[DUE]))

        self.billing.start(record)
        self.sales.start(lambda _msg, _tx: None)

    def sample(self) -> None:
        stats = self.sales.stats()["delayed"] or {}
        for key in self.peak:
            self.peak[key] = max(self.peak[key], stats.get(key) or 0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.billing.close()
            self.sales.close()

    def finish(self) -> dict[str, Any]:
        """Stop both endpoints; the detail: lateness, what reached Billing, the mover's stats."""
        stats = self.sales.stats()["delayed"] or {}
        self.close()
        got = delivered(self.ids, read_ids(self.ctx, transport_queue_topic(self.ns, BILLING)))
        return {
            **self.lateness.detail(),
            **got,
            "mover_moved": stats.get("moved"),
            "mover_reads": stats.get("reads"),
            "held_peak": self.peak["held"],
            "held_mb_peak": round(self.peak["held_bytes"] / 1e6, 1),
            "dead_lettered": stats.get("dead_lettered"),
            "handled_again": self.lateness.again,
        }


# --- baseline ----------------------------------------------------------------------------------


class BaselineScheduler:
    """What a good Kafka user would write for delayed delivery: one consumer reads the store
    topic into a heap by due time; when one is due it is produced to the destination with an
    idempotent producer (no transactions, nothing committed: the heap is the state). It waits
    for the next due time, or a second at most, as the mover does. A second consumer on the
    destination records each message's lateness."""

    def __init__(self, ctx: BenchContext, tag: str):
        self.ctx = ctx
        self.ns = f"bench-{tag}-{uuid.uuid4().hex[:8]}"[:40]
        ctx.namespaces.append(self.ns)
        install(ctx.cluster, self.ns, InstallPlan(((STORE, PRIMARY_PARTITIONS), (DESTINATION, PRIMARY_PARTITIONS))))
        self.store, self.destination = (
            transport_queue_topic(self.ns, STORE),
            transport_queue_topic(self.ns, DESTINATION),
        )
        self.lateness = Lateness()
        self.ids: set[str] = set()
        self.moved = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def send(self, dues: list[int], body: bytes) -> float:
        """Every record to the store topic with a fast producer, one flush at the end."""
        n = len(dues)
        producer, delivery = fast_producer(self.ctx.cluster), Delivery()
        t0 = time.perf_counter()
        with self.ctx.reporter.bar(f"baseline: {n:,} records to a plain topic", n) as advance:
            for i, due in enumerate(dues):
                key, value, hs = transport_record(body, HEADERS, SENDER)
                self.ids.add(key.decode() if isinstance(key, bytes) else key)
                hs.append((DUE, str(due).encode()))
                produce(producer, self.store, key=key, value=value, headers=hs, on_delivery=delivery)
                if i % 1000 == 999:
                    producer.poll(0)
                    advance(1000)
            delivery.check(producer.flush(120))
            advance(n % 1000)
        return time.perf_counter() - t0

    def start(self) -> None:
        for target, name in ((self._schedule, "scheduler"), (self._receive, "receiver")):
            t = threading.Thread(target=self._guarded, args=(target,), name=f"bench-baseline-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _guarded(self, target: Any) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - raised again by finish, on the bench's thread
            self._errors.append(exc)

    def _schedule(self) -> None:
        consumer = clients.consumer(self.ctx.cluster, f"baseline.{self.store}", **{"auto.offset.reset": "earliest"})
        producer, delivery = clients.idempotent_producer(self.ctx.cluster), Delivery()
        heap: list[tuple[int, int, Any]] = []  # (due, seq, the record)
        seq = itertools.count()
        try:
            consumer.subscribe([self.store])
            while not self._stop.is_set():
                now_ms = int(time.time() * 1000)
                wait = INTERVAL if not heap else min(INTERVAL, max(heap[0][0] - now_ms, 0) / 1000)
                for rec in clients.consume_soon(consumer, 500, wait):
                    if rec.error() is None:
                        due = due_of(rec)
                        heapq.heappush(heap, (due, next(seq), rec))
                now_ms = int(time.time() * 1000)
                while heap and heap[0][0] <= now_ms:
                    rec = heapq.heappop(heap)[2]
                    produce(
                        producer,
                        self.destination,
                        key=rec.key(),
                        value=rec.value(),
                        headers=rec.headers(),
                        on_delivery=delivery,
                    )
                    self.moved += 1
                producer.poll(0)
                delivery.check(0)
        finally:
            delivery.check(producer.flush(30))
            consumer.close()

    def _receive(self) -> None:
        consumer = clients.consumer(
            self.ctx.cluster, f"baseline.{self.destination}", **{"auto.offset.reset": "earliest"}
        )
        try:
            consumer.subscribe([self.destination])
            while not self._stop.is_set():
                for rec in clients.consume_soon(consumer, 500, 0.1):  # at once, not after 0.1 s
                    if rec.error() is None:
                        self.lateness.arrived((rec.key() or b"").decode(), due_of(rec))
        finally:
            consumer.close()

    def check(self) -> None:
        if self._errors:
            raise RuntimeError(f"baseline: {type(self._errors[0]).__name__}: {self._errors[0]}") from self._errors[0]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)
        self._threads.clear()

    def finish(self) -> dict[str, Any]:
        self.stop()
        self.check()
        got = delivered(self.ids, read_ids(self.ctx, self.destination))
        return {**self.lateness.detail(), **got, "handled_again": self.lateness.again}


# --- the scenario ------------------------------------------------------------------------------


def run_delayed(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    n, window = ctx.params.delayed_messages, float(ctx.params.delayed_seconds)
    body = order_body(ctx.params.body_bytes)
    lead = LEAD_BASE + n * LEAD_PER_MESSAGE
    t_begin = time.time()
    base_ms = int((t_begin + lead) * 1000)
    dues = due_times(n, base_ms, window, seed=rep)
    ctx.say(f"transport-delayed: {n:,} messages due over {window:g} s, the first {lead:.1f} s from now")
    kb, bl = KBrokerSide(ctx, "tdelay-k"), BaselineScheduler(ctx, "tdelay-b")
    send_seconds = {}
    try:
        for side in ("kbroker", "baseline") if rep % 2 == 0 else ("baseline", "kbroker"):
            send_seconds[side] = (kb if side == "kbroker" else bl).send(dues, body)
        kb.start()
        bl.start()
        slack = base_ms / 1000 - time.time()
        if slack < 2:
            ctx.say(f"[yellow]transport-delayed: the sends overran the lead ({slack:.1f} s left)[/yellow]")
        deadline = time.time() + max(slack, 0) + window + 60
        with ctx.reporter.bar(f"both sides: {n:,} delayed messages each, handed over when due", 2 * n) as advance:
            last = 0
            while len(kb.lateness) < n or len(bl.lateness) < n:
                if time.time() > deadline:
                    raise RuntimeError(
                        f"only {len(kb.lateness):,} (kbroker) and {len(bl.lateness):,} (baseline) of {n:,} "
                        f"messages handed over within 60 s of the window's end (mover: {kb.sales.stats()['delayed']})"
                    )
                bl.check()
                kb.sample()
                done = len(kb.lateness) + len(bl.lateness)
                advance(done - last)
                last = done
                time.sleep(SAMPLE_EVERY)
            advance(2 * n - last)
        time.sleep(1.0)  # anything handed over twice comes in now
        details = {"kbroker": kb.finish(), "baseline": bl.finish()}
    finally:
        kb.close()
        bl.stop()
    out: dict[str, Any] = {}
    for side, detail in details.items():
        detail.update(send_seconds=round(send_seconds[side], 2), lead_slack_s=round(slack, 1))
        wrong = {k: detail[k] for k in ("lost", "duplicated", "early", "handled_again") if detail[k]}
        if wrong:
            raise RuntimeError(f"{side}: delayed delivery not exactly once and on time: {wrong}; {detail}")
        out[side], out[f"{side}_detail"] = detail["p99_ms"], detail
    return {"transport-delayed": out}


def _summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}

    def g(d: dict, key: str) -> str:
        return "-" if d.get(key) is None else f"{d[key]:,g}"

    if k and b:
        out["summary"] = (
            f"lateness p50/p99/max ms: kbroker {g(k, 'p50_ms')}/{g(k, 'p99_ms')}/{g(k, 'max_ms')}, "
            f"baseline {g(b, 'p50_ms')}/{g(b, 'p99_ms')}/{g(b, 'max_ms')}; kbroker moved {g(k, 'moved')}, "
            f"lost {g(k, 'lost')}, duplicated {g(k, 'duplicated')}; its mover read its store "
            f"{g(k, 'mover_reads')} time(s), held {g(k, 'held_mb_peak')} MB at most"
        )


scenario(
    Scenario(
        name="transport-delayed",
        description="the transport face's delayed delivery: how late a message due at a time is handed over",
        rows=(
            Row(
                "transport-delayed",
                "ms (p99)",
                f"p99 <= {TARGET_MS:,.0f} ms (interval + 1 s)",
                check=lambda r: r["kbroker"] <= TARGET_MS,
                floor=Floor(2 * TARGET_MS, "kbroker", at_most=True),
                baseline_code="kbroker/bench/scenarios/transport_delayed.py:BaselineScheduler",
                notes="N messages (--delayed-messages) due uniformly at random over a window (--delayed-seconds), "
                "written first; kbroker: Sales's tx.send(..., not_before=) "
                f"{PER_TRANSACTION} per transaction, then Sales started (its DelayedMover) and Billing started "
                "recording now - due; baseline: a plain producer to a plain topic, a consumer holding the "
                "records in a heap and producing each to a destination when due (idempotent, no "
                "transactions), a consumer of the destination recording now - due. Both sides run over the "
                "same window at the same time; each destination is read whole: a message lost, there twice "
                "or handed over early fails the scenario",
                finish=_summary,
            ),
        ),
        run=run_delayed,
    )
)
