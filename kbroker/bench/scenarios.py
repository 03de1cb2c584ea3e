"""The scenarios. Each measures kbroker and a plain confluent-kafka baseline doing the same job,
in the same repetition, on the same broker, in fresh namespaces with topics/samples applied
(ExpenseQueue has 4 partitions). Bodies are 100-byte JSON expense claims.

Records written by the harness itself (requests, backlogs) are kbroker's wire format: key = the
receiving side's conversation group, headers from kbroker.envelope.Envelope. A request is the
first (or next) message of a dialog from //Adventure-Works.com/Employees to
//Adventure-Works.com/Expenses on the ExpenseSubmission contract, as Broker.send would write it.
"""

from __future__ import annotations

import gc
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson
import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from kbroker.bench.harness import (
    BASELINE_OVER_KBROKER,
    BenchContext,
    Row,
    Scenario,
    Skip,
    scenario,
)
from kbroker.config import KAFKA_LOG
from kbroker.core import names
from kbroker.core.envelope import Envelope
from kbroker.kafka.clients import produce
from kbroker.sdk.broker import Broker

EMP = "//Adventure-Works.com/Employees"
EXP = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"
QUEUE, REPLY_QUEUE = "ExpenseQueue", "EmployeeQueue"

NOT_IMPLEMENTED = "transactions not implemented"
RR_READERS = 64  # request-reply: kbroker responder threads sharing one Broker (default of --readers)
IO_READERS = 32  # io-bound: kbroker reader threads sharing one Broker
IO_DELAY = 0.005  # io-bound: what the handler awaits per message
BATCH_RECORDS, BATCH_SECONDS = 100, 0.1  # request-reply baseline: commit every 100 records or 100 ms
RSS_RECEIVE = 1_000  # backlog-rss: messages the child receives
# backlog-rss: how far above the connect-only child the receiving child may go and still count as
# bounded. The receiver buffers at most 20,000 records before pausing its partitions, and
# librdkafka pre-fetches at most queued.max.messages.kbytes (16 MiB) into its queue; with 100-byte
# bodies and ~450 bytes of headers both stay below this, whatever the backlog.
RSS_BOUND_MB = 256


def json_body(size: int = 100, **fields: Any) -> bytes:
    """A JSON object of exactly `size` bytes (ExpenseClaim and ExpenseApproval validate JSON)."""
    head = orjson.dumps({**fields, "pad": ""})[:-2]  # ... "pad":"
    pad = size - len(head) - 2
    if pad < 0:
        raise ValueError(f"a {size}-byte body cannot hold {fields}")
    body = head + b"x" * pad + b'"}'
    assert len(body) == size
    return body


def claim_body(size: int) -> bytes:
    return json_body(size, amount=12.5, currency="EUR", employee="E-1042")


def approval_body(size: int) -> bytes:
    return json_body(size, approved=True, by="expenses")


def has_transactions() -> bool:
    return hasattr(Broker, "transaction")


# --- records in kbroker's wire format --------------------------------------------------------


def claim_headers(conversation_id: str, seq: int) -> list[tuple[str, bytes]]:
    """Headers of the seq-th ExpenseClaim of a dialog, as the initiator's SEND writes them."""
    return Envelope(message_id=str(uuid.uuid4()), conversation_id=conversation_id,
                    conversation_group_id=conversation_id, message_sequence_number=seq,
                    message_type_name=CLAIM, service_contract_name=CONTRACT, from_service_name=EMP,
                    to_service_name=EXP, to_side="TARGET").headers()


def approval_headers(conversation_id: str, seq: int) -> list[tuple[str, bytes]]:
    """Headers of the seq-th ExpenseApproval, sent back by the target."""
    return Envelope(message_id=str(uuid.uuid4()), conversation_id=conversation_id,
                    conversation_group_id=conversation_id, message_sequence_number=seq,
                    message_type_name=APPROVAL, service_contract_name=CONTRACT, from_service_name=EXP,
                    to_service_name=EMP, to_side="INITIATOR").headers()


class Delivery:
    """One delivery callback for a producer; remembers the first error."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None
        self.delivered = 0

    def __call__(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.error = self.error or err
        else:
            self.delivered += 1

    def check(self, remaining: int = 0) -> None:
        if self.error is not None:
            raise KafkaException(self.error)
        if remaining:
            raise RuntimeError(f"{remaining} record(s) not acknowledged in time")


def sdk_like_producer(bootstrap: str) -> Producer:
    """The settings Broker uses for SEND: idempotent, acks=all, linger 1 ms."""
    return Producer({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG, "enable.idempotence": True,
                     "acks": "all", "linger.ms": 1})


def fast_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG, "enable.idempotence": True,
                     "acks": "all", "linger.ms": 50, "batch.size": 1_000_000,
                     "queue.buffering.max.messages": 1_000_000,
                     "queue.buffering.max.kbytes": 1_048_576})


def produce_dialogs(ctx: BenchContext, topic: str, conversations: list[str], per_conversation: int,
                    body: bytes, label: str, total: int | None = None) -> int:
    """Write a backlog of ExpenseClaims: round-robin over the dialogs, each dialog's messages in
    sequence order. Returns the bytes written (key + value + headers)."""
    total = total if total is not None else len(conversations) * per_conversation
    producer, delivery = fast_producer(ctx.bootstrap), Delivery()
    written = 0
    with ctx.reporter.bar(label, total) as advance:
        for i in range(total):
            conv = conversations[i % len(conversations)]
            hs = claim_headers(conv, i // len(conversations))
            if i == 0:
                written = len(conv) + len(body) + sum(len(k) + len(v) for k, v in hs)
            produce(producer, topic, key=conv, value=body, headers=hs, on_delivery=delivery)
            if i % 10_000 == 9_999:
                producer.poll(0)
                advance(10_000)
        advance(total % 10_000)
        delivery.check(producer.flush(300))
    return written * total


def new_conversations(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def sides(rep: int) -> tuple[str, str]:
    """Which side goes first alternates between repetitions."""
    return ("kbroker", "baseline") if rep % 2 == 0 else ("baseline", "kbroker")


# --- send ---------------------------------------------------------------------------------------


class KBrokerSender:
    def __init__(self, ctx: BenchContext, namespace: str, conversations: int, body: bytes):
        self.ctx, self.body = ctx, body
        self.broker = Broker(ctx.bootstrap, namespace)
        ctx.say(f"kbroker: beginning {conversations:,} dialogs")
        self.handles = [self.broker.begin_dialog(EMP, EXP, CONTRACT) for _ in range(conversations)]
        for h in self.handles[:20]:  # warm-up: connections, catalog, code paths
            self.broker.send(h, CLAIM, body)

    def run(self, n: int, pipelined: bool) -> float:
        handles, c, body, b = self.handles, len(self.handles), self.body, self.broker
        gc.collect()
        label = "kbroker SEND in one transaction" if pipelined else "kbroker SEND"
        with self.ctx.reporter.bar(label, n) as advance:
            t0 = time.perf_counter()
            if pipelined:
                with b.transaction() as tx:
                    for i in range(n):
                        tx.send(handles[i % c], CLAIM, body)
                        if i % 1000 == 999:
                            advance(1000)
            else:
                for i in range(n):
                    b.send(handles[i % c], CLAIM, body)
                    if i % 1000 == 999:
                        advance(1000)
            elapsed = time.perf_counter() - t0
            advance(n % 1000)
        return n / elapsed

    def close(self) -> None:
        self.broker.close()


class BaselineSender:
    """A plain producer writing the records SEND writes to the queue (same topic, key, value,
    headers and producer settings); not the endpoint updates, which are kbroker's own."""

    def __init__(self, ctx: BenchContext, topic: str, conversations: int, body: bytes):
        self.ctx, self.topic, self.body = ctx, topic, body
        self.producer = sdk_like_producer(ctx.bootstrap)
        self.conversations = new_conversations(conversations)
        self.seq = [0] * conversations
        self.send(20, flush_each=True)  # warm-up

    def send(self, n: int, flush_each: bool, advance: Callable[[int], None] = lambda n: None) -> None:
        p, topic, body, convs, seq = self.producer, self.topic, self.body, self.conversations, self.seq
        c, delivery = len(convs), Delivery()
        for i in range(n):
            j = i % c
            conv = convs[j]
            hs = claim_headers(conv, seq[j])
            seq[j] += 1
            while True:  # written out, not a kbroker helper: this is the plain baseline loop
                try:
                    p.produce(topic, key=conv, value=body, headers=hs, on_delivery=delivery)
                    break
                except BufferError:
                    p.poll(0.01)
            if flush_each:
                delivery.check(p.flush(30))
            if i % 1000 == 999:
                advance(1000)
        delivery.check(p.flush(60))
        advance(n % 1000)

    def run(self, n: int, pipelined: bool) -> float:
        gc.collect()
        label = "baseline producer, one flush" if pipelined else "baseline producer, flush each"
        with self.ctx.reporter.bar(label, n) as advance:
            t0 = time.perf_counter()
            self.send(n, flush_each=not pipelined, advance=advance)
            elapsed = time.perf_counter() - t0
        return n / elapsed

    def close(self) -> None:
        self.producer.flush(30)


def run_send(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    p = ctx.params
    n, c = p.messages, max(1, min(p.conversations, p.messages))
    body = claim_body(p.body_bytes)
    ns = ctx.fresh_namespace("send")
    kb = KBrokerSender(ctx, ns, c, body)
    bl = BaselineSender(ctx, names.queue_topic(ns, QUEUE), c, body)
    out: dict[str, dict] = {"send": {}, "send-pipelined": {}}
    try:
        for row, pipelined in (("send", False), ("send-pipelined", True)):
            for side in sides(rep):
                if side == "baseline":
                    out[row]["baseline"] = bl.run(n, pipelined)
                elif pipelined and not has_transactions():
                    out[row]["kbroker"] = None
                    out[row]["skipped_reason"] = "not available yet (Broker.transaction() does not exist)"
                else:
                    out[row]["kbroker"] = kb.run(n, pipelined)
    finally:
        kb.close()
        bl.close()
    return out


scenario(Scenario(
    name="send",
    description="SEND throughput, acknowledged per message (and pipelined)",
    rows=(
        Row("send", "msg/s", "ratio >= 0.8", check=lambda r: r["ratio"] >= 0.8,
            notes="Broker.send, N messages over C dialogs, each acknowledged on return (the SDK also "
                  "writes the endpoint on a dialog's first SEND and once per 64 after) vs a "
                  "confluent-kafka Producer writing the same records with the same settings and "
                  "flushing after each"),
        Row("send-pipelined", "msg/s", None,
            notes="N SENDs in one kbroker transaction (committed at the end) vs a producer loop "
                  "flushing once at the end; no target"),
    ),
    run=run_send,
))


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

    def __init__(self, bootstrap: str, topic: str, conversations: list[str], total: int, body: bytes):
        self.topic, self.conversations, self.total, self.body = topic, conversations, total, body
        self.seq = {c: 0 for c in conversations}
        self.ready: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.producer = Producer({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG,
                                  "enable.idempotence": True, "acks": "all", "linger.ms": 1})
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
                self.producer.produce(self.topic, key=conv, value=self.body,
                                      headers=claim_headers(conv, seq), on_delivery=self.delivery)
                self.producer.poll(0)
                self.delivery.check()
        except BaseException as exc:  # reported by the scenario
            self.error = exc


def kbroker_responders(ctx: BenchContext, namespace: str, tally: Tally, reply: bytes,
                       stop: threading.Event, errors: list[BaseException]) -> tuple[list[threading.Thread], Callable[[], None]]:
    broker = Broker(ctx.bootstrap, namespace)

    def work() -> None:
        try:
            while not stop.is_set():
                with broker.transaction() as tx:
                    msgs = tx.receive(QUEUE, top=100, wait=0.5)
                    for m in msgs:
                        tx.send(m.conversation_handle, APPROVAL, reply)
                if msgs:  # the transaction committed when the with-block ended
                    tally.committed([(m.conversation_id, m.enqueued_time) for m in msgs])
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, name=f"kbroker-responder-{i}", daemon=True)
               for i in range(ctx.params.readers)]
    return threads, broker.close


def baseline_responder(ctx: BenchContext, namespace: str, tally: Tally, reply: bytes,
                       stop: threading.Event, errors: list[BaseException]) -> tuple[list[threading.Thread], Callable[[], None]]:
    """A hand-written consume-transform-produce loop: transactional producer, offsets sent to
    the transaction, one commit per 100 records or 100 ms."""
    topic = names.queue_topic(namespace, QUEUE)
    reply_topic = names.queue_topic(namespace, REPLY_QUEUE)

    def work() -> None:
        consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "logger": KAFKA_LOG,
                             "group.id": f"baseline.{topic}", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        producer = Producer({"bootstrap.servers": ctx.bootstrap, "logger": KAFKA_LOG,
                             "transactional.id": f"baseline.{topic}", "linger.ms": 1})
        try:
            producer.init_transactions(30)
            consumer.subscribe([topic])
            reply_seq: dict[str, int] = {}
            pending: list[tuple[str, int]] = []
            started = 0.0
            producer.begin_transaction()
            while not stop.is_set():
                left = BATCH_SECONDS - (time.monotonic() - started) if pending else BATCH_SECONDS
                for rec in consumer.consume(BATCH_RECORDS - len(pending), max(left, 0.0)):
                    if rec.error():
                        if rec.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(rec.error())
                    conv = rec.key().decode()
                    seq = reply_seq.get(conv, 0)
                    reply_seq[conv] = seq + 1
                    producer.produce(reply_topic, key=rec.key(), value=reply,
                                     headers=approval_headers(conv, seq))
                    if not pending:
                        started = time.monotonic()
                    pending.append((conv, rec.timestamp()[1]))
                if pending and (len(pending) >= BATCH_RECORDS or time.monotonic() - started >= BATCH_SECONDS):
                    positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
                    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
                    producer.commit_transaction(30)
                    tally.committed(pending)
                    pending = []
                    producer.begin_transaction()
            producer.abort_transaction(30)
        except BaseException as exc:
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
    requester = Requester(ctx.bootstrap, names.queue_topic(ns, QUEUE), warm + measured, n,
                          claim_body(p.body_bytes))
    sent = [0]

    def next_request(conv: str) -> None:  # under the tally's lock
        if sent[0] < n:
            sent[0] += 1
            requester.request(conv)

    tally = Tally(set(warm), n, next_request)
    stop, errors = threading.Event(), []
    make = kbroker_responders if side == "kbroker" else baseline_responder
    threads, close = make(ctx, ns, tally, approval_body(p.body_bytes), stop, errors)
    requester.start()
    for t in threads:
        t.start()
    try:
        ctx.say(f"{side}: warming up on {len(warm)} dialogs")
        for conv in warm:
            requester.request(conv)
        if not _wait(tally.warmed, errors, requester, 120):
            raise RuntimeError(f"{side}: warm-up replies did not arrive within 120 s "
                               f"({tally.warm_replies}/{len(warm)})")
        gc.collect()
        with ctx.reporter.bar(f"{side} request-reply", n) as advance:
            t0 = time.perf_counter()
            with tally.lock:
                for _ in range(p.in_flight):
                    for conv in measured:
                        next_request(conv)
            deadline = 120 + n / 100
            last = 0
            while not tally.done.is_set():
                if not _wait(tally.done, errors, requester, 0.25):
                    if time.perf_counter() - t0 > deadline:
                        raise RuntimeError(f"{side}: only {tally.replies:,} of {n:,} replies after "
                                           f"{deadline:.0f} s")
                advance(tally.replies - last)
                last = tally.replies
            elapsed = tally.t_last - t0
    finally:
        stop.set()
        requester.stop()
        if join_all(threads, 30):
            close()
        else:  # a statement that never returns: closing under it could hang the run too
            ctx.say(f"[yellow]{side}: responder threads did not stop; the connection is left open[/yellow]")
    lat = sorted(tally.latencies)
    return {"value": n / elapsed, "detail": {
        "p50_ms": _percentile(lat, 50), "p99_ms": _percentile(lat, 99), "seconds": elapsed}}


def join_all(threads: list[threading.Thread], timeout: float) -> bool:
    """Join with one deadline for all; True when every thread ended."""
    deadline = time.monotonic() + timeout
    for t in threads:
        if t.ident is not None:
            t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


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


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]


def need_transactions(_ctx: BenchContext) -> None:
    if not has_transactions():
        raise Skip(NOT_IMPLEMENTED)


def run_request_reply(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    row: dict[str, Any] = {}
    for side in sides(rep):
        m = measure_request_reply(ctx, side)
        row[side], row[f"{side}_detail"] = m["value"], m["detail"]
    return {"request-reply": row}


def _latency_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}

    def ratio(key: str) -> float | None:
        return float(f"{b[key] / k[key]:.5g}") if k.get(key) and b.get(key) is not None else None

    out["latency_ms"] = {
        "kbroker": {"p50": k.get("p50_ms"), "p99": k.get("p99_ms")},
        "baseline": {"p50": b.get("p50_ms"), "p99": b.get("p99_ms")},
        "ratio_p50": ratio("p50_ms"), "ratio_p99": ratio("p99_ms"),
        "ratio_definition": f"{BASELINE_OVER_KBROKER} (above 1: kbroker answers faster)",
    }
    if k or b:
        out["summary"] = (f"latency p50/p99 ms: kbroker {k.get('p50_ms')}/{k.get('p99_ms')}, "
                          f"baseline {b.get('p50_ms')}/{b.get('p99_ms')}")


scenario(Scenario(
    name="request-reply",
    description="transactional request/reply over C dialogs: throughput and latency",
    rows=(Row("request-reply", "msg/s", ">= 20,000 msg/s and ratio >= 0.5",
              check=lambda r: r["kbroker"] >= 20_000 and r["ratio"] >= 0.5,
              notes="closed loop, --in-flight claims (default 1) in flight per dialog; kbroker: --readers "
                    f"(default {RR_READERS}) threads, each "
                    "`with broker.transaction() as tx: tx.receive(top=100)` + tx.send per message; "
                    "baseline: consume-transform-produce, transactional producer, "
                    "send_offsets_to_transaction, commit every 100 records or 100 ms. Latency = reply "
                    "commit - request enqueued; its ratio is baseline/kbroker",
              finish=_latency_summary),),
    run=run_request_reply,
    setup=need_transactions,
))


# --- io-bound -------------------------------------------------------------------------------------


def measure_io_bound(ctx: BenchContext, side: str) -> dict:
    c = ctx.params.conversations
    total = 2 * c
    ns = ctx.fresh_namespace(f"io-{side[0]}")
    produce_dialogs(ctx, names.queue_topic(ns, QUEUE), new_conversations(c), 2,
                    claim_body(ctx.params.body_bytes), f"{side}: {total:,} messages on {c:,} dialogs")
    lock = threading.Lock()
    state = {"done": 0, "first": None, "last": None}
    deadline = time.monotonic() + 60 + total * IO_DELAY * 1.5
    gc.collect()
    t_start = time.perf_counter()

    def handled(n: int, first_at: float) -> None:
        with lock:
            state["done"] += n
            state["first"] = first_at if state["first"] is None else min(state["first"], first_at)
            state["last"] = time.perf_counter()

    if side == "kbroker":
        broker = Broker(ctx.bootstrap, ns)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                while state["done"] < total and time.monotonic() < deadline:
                    with broker.transaction() as tx:
                        msgs = tx.receive(QUEUE, top=10, wait=1)
                        got = time.perf_counter()
                        for _ in msgs:
                            time.sleep(IO_DELAY)
                    if msgs:
                        handled(len(msgs), got)
            except BaseException as exc:
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
                    advance(state["done"] - last)
                    last = state["done"]
            if errors:
                raise errors[0]
        finally:
            if join_all(threads, 5):
                broker.close()
            else:
                ctx.say("[yellow]kbroker: reader threads did not stop; the connection is left open[/yellow]")
    else:
        consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "logger": KAFKA_LOG,
                             "group.id": f"baseline.{names.queue_topic(ns, QUEUE)}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([names.queue_topic(ns, QUEUE)])
            with ctx.reporter.bar("baseline, one consumer in partition order", total) as advance:
                while state["done"] < total and time.monotonic() < deadline:
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
    if state["done"] < total:
        raise RuntimeError(f"{side}: only {state['done']:,} of {total:,} messages handled in time")
    elapsed = state["last"] - state["first"]
    return {"value": total / elapsed, "detail": {
        "seconds": elapsed, "wall_seconds": state["last"] - t_start}}


def run_io_bound(ctx: BenchContext, _state: Any, rep: int) -> dict[str, dict]:
    row: dict[str, Any] = {}
    for side in sides(rep):
        m = measure_io_bound(ctx, side)
        row[side], row[f"{side}_detail"] = m["value"], m["detail"]
    return {"io-bound": row}


scenario(Scenario(
    name="io-bound",
    description=f"handler awaiting {IO_DELAY * 1000:.0f} ms per message, C dialogs x 2 messages",
    rows=(Row("io-bound", "msg/s", "ratio >= 10", check=lambda r: r["ratio"] >= 10,
              notes=f"kbroker: {IO_READERS} threads, each `with broker.transaction() as tx: "
                    "tx.receive(top=10, wait=1)`, 5 ms per message; baseline: one consumer handling "
                    "records in partition order, 5 ms each. Timed from the first message handed out to "
                    "the last one handled (consumer start-up excluded on both sides)"),),
    run=run_io_bound,
    setup=need_transactions,
))


# --- backlog-rss ----------------------------------------------------------------------------------

# The child process: only kbroker is imported. "kbroker" receives COUNT messages; "baseline" only
# connects. Prints one JSON line with its peak RSS (the kernel's high-water mark, VmHWM).
CHILD = r"""
import json, resource, sys, time
mode, bootstrap, namespace, queue, count = sys.argv[1:6]
count = int(count)
import kbroker
t0 = time.monotonic()
broker = kbroker.connect(bootstrap, namespace)
received, first = 0, None
if mode == "kbroker":
    deadline = time.monotonic() + 240
    while received < count and time.monotonic() < deadline:
        got = len(broker.receive(queue, top=100, wait=5))
        if not got:
            break  # the queue is empty: the parent reports the shortfall
        if first is None:
            first = time.monotonic() - t0
        received += got
def peak_rss_kb():
    # VmHWM: the high-water mark of this process's own memory. Not getrusage's ru_maxrss, which
    # Linux carries over from the parent that forked this process (the harness's own size).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rss_kb = peak_rss_kb()
broker.close()
print(json.dumps({"peak_rss_kb": rss_kb, "received": received, "seconds": time.monotonic() - t0,
                  "first_message_s": first}))
"""


def run_child(ctx: BenchContext, mode: str, namespace: str, count: int) -> dict:
    """Run the child, sampling its RSS with psutil as a cross-check of its own high-water mark."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, ctx.bootstrap, namespace, QUEUE, str(count)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampled = 0
    try:
        ps = psutil.Process(proc.pid)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                sampled = max(sampled, ps.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)
        if proc.poll() is None:
            raise RuntimeError(f"the {mode} child did not finish within 300 s")
        out, err = proc.communicate(timeout=30)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        tail = " | ".join(line for line in err.strip().splitlines()[-3:])
        raise RuntimeError(f"the {mode} child exited with {proc.returncode}: {tail}")
    result = orjson.loads(out.strip().splitlines()[-1])
    if mode == "kbroker" and result["received"] < count:
        raise RuntimeError(f"the kbroker child received {result['received']} of {count} messages")
    result["sampled_peak_mb"] = sampled / 2**20
    return result


@dataclass
class Backlog:
    namespace: str
    messages: int
    bytes: int


def setup_backlog(ctx: BenchContext) -> Backlog:
    p = ctx.params
    ns = ctx.fresh_namespace("rss")
    c = max(1, min(p.conversations, p.backlog))
    size = produce_dialogs(ctx, names.queue_topic(ns, QUEUE), new_conversations(c), 0,
                           claim_body(p.body_bytes), f"backlog of {p.backlog:,} messages",
                           total=p.backlog)
    return Backlog(ns, p.backlog, size)


def run_backlog_rss(ctx: BenchContext, backlog: Backlog, rep: int) -> dict[str, dict]:
    row: dict[str, Any] = {}
    # Every kbroker child takes its messages off the same backlog (a RECEIVE may return up to 99
    # more than asked): leave enough for each repetition.
    count = max(1, min(RSS_RECEIVE, backlog.messages // (2 * ctx.params.repeat)))
    for side in sides(rep):
        ctx.say(f"{side} child: " + (f"receiving {count:,} messages" if side == "kbroker" else "connecting"))
        r = run_child(ctx, side, backlog.namespace, count)
        row[side] = r["peak_rss_kb"] / 1024
        row[f"{side}_detail"] = {k: v for k, v in r.items() if k != "peak_rss_kb"}
    row["backlog_messages"], row["backlog_mb"] = backlog.messages, round(backlog.bytes / 2**20, 1)
    return {"backlog-rss": row}


def _rss_summary(out: dict) -> None:
    runs = out["runs"]
    backlog = runs[0].get("backlog_messages") if runs else None
    mb = runs[0].get("backlog_mb") if runs else None
    k, b = out.get("kbroker"), out.get("baseline")
    if k is not None and b is not None:
        out["growth_mb"] = round(k - b, 1)
        out["summary"] = (f"{'bounded' if out['met'] else 'NOT bounded'}: receiving child "
                          f"{k:,.0f} MB peak, +{k - b:,.0f} MB over connect-only, with a backlog of "
                          f"{backlog:,} messages (~{mb:,.0f} MB of records)")


scenario(Scenario(
    name="backlog-rss",
    description="peak RSS of a process receiving from a queue with a large backlog",
    rows=(Row("backlog-rss", "MB", f"bounded: <= baseline + {RSS_BOUND_MB} MB",
              check=lambda r: r["kbroker"] - r["baseline"] <= RSS_BOUND_MB,
              notes=f"child process: connect, RECEIVE {RSS_RECEIVE:,} messages (top=100) from a queue "
                    "holding the backlog, peak RSS (VmHWM) vs a child that only imports kbroker and "
                    "connects; ratio is kbroker/baseline (lower is better)",
              finish=_rss_summary),),
    run=run_backlog_rss,
    setup=setup_backlog,
))
