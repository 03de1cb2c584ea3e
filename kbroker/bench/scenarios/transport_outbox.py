"""The transport-outbox scenario: what the transport face's outbox (sdk/transport/outbox.py)
costs per message, against the same endpoint without it, on the same broker, in the same
repetition. The baseline is kbroker too: what a user writes who does not need exactly once
between the database and the queues.

N messages (`--outbox-messages`) preloaded on Billing (4 partitions); an endpoint of Billing
started with concurrency="fixed", max_concurrency=1 (one SQLite writer), its handler writing
one row to the application's SQLite database (a file in a new temporary directory, SQLAlchemy's
defaults) and sending one message to Out:

    kbroker   outbox=Outbox(create_engine("sqlite:///<tmp>/app.db")); the handler's INSERT goes
              through `tx.db`, in the database transaction that also stores its send in the
              outbox table; the send is dispatched with the message's removal, and the outbox
              row marked dispatched afterwards
    baseline  no outbox: the handler's INSERT in its own `engine.begin()` block (committed before
              the handler returns), then the same `tx.send`, committed with the removal

Each side is timed from the first message handed out to the last one committed (the
endpoint's `committed` counter), as transport-receive is; `wall_seconds` in the detail counts
from the endpoint's start. Afterwards Out is read whole (read_committed) and must hold exactly N
messages, the database's table N rows of N distinct messages and, with the outbox, its table N
rows, every one dispatched; anything else fails the repetition.

SQLAlchemy is the `outbox` extra, not the bench's: without it the scenario is skipped (it is
imported when the scenario runs, so the other scenarios never need it)."""

from __future__ import annotations

import gc
import importlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kbroker.bench.common import side_by_side
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, Skip, scenario
from kbroker.bench.partition_workers import Clock
from kbroker.bench.scenarios.transport import order_body, preload, transport_namespace, wait_committed
from kbroker.core.transport.endpoint import FIXED, transport_queue_topic
from kbroker.core.transport.message import TransportMessage
from kbroker.kafka.baseline import read_topic_to_end
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.transaction import TransportTransaction

RECEIVER, OUT = "Billing", "Out"
MODEL, CONCURRENCY = FIXED, 1  # SQLite: one writer at a time
TARGET, FLOOR = 0.5, 0.2
CREATE = "CREATE TABLE orders (message_id TEXT NOT NULL, body BLOB)"
INSERT = "INSERT INTO orders (message_id, body) VALUES (?, ?)"  # pysqlite's qmark parameters
COUNT = "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM orders"


def database_tools(_ctx: BenchContext) -> tuple[Callable[[str], Any], Any]:
    """The scenario's setup: (sqlalchemy.create_engine, Outbox), or Skip without SQLAlchemy."""
    try:
        create_engine = importlib.import_module("sqlalchemy").create_engine
        from kbroker.sdk.transport.outbox import Outbox
    except ImportError as exc:
        raise Skip(f"SQLAlchemy is not installed ({exc}); pip install 'kbroker[outbox]'") from None
    return create_engine, Outbox


def outbox_handler(clock: Clock) -> Callable[[TransportMessage, TransportTransaction], None]:
    """kbroker's side: the INSERT through the outbox's database transaction, and the send."""

    def handle(msg: TransportMessage, tx: TransportTransaction) -> None:
        clock.started()
        tx.db.exec_driver_sql(INSERT, (msg.id, msg.body))
        tx.send(OUT, msg.body)

    return handle


def plain_handler(clock: Clock, engine: Any) -> Callable[[TransportMessage, TransportTransaction], None]:
    """The baseline's: the INSERT in a database transaction of its own, then the send."""

    def handle(msg: TransportMessage, tx: TransportTransaction) -> None:
        clock.started()
        with engine.begin() as conn:
            conn.exec_driver_sql(INSERT, (msg.id, msg.body))
        tx.send(OUT, msg.body)

    return handle


def measure_outbox(ctx: BenchContext, tools: tuple[Callable[[str], Any], Any], side: str, n: int) -> dict[str, Any]:
    """One side: `n` messages on Billing handled by an endpoint with an outbox (side "kbroker")
    or without one (side "baseline", plain_handler); checked afterwards."""
    create_engine, outbox_class = tools
    ns = transport_namespace(ctx, f"tobx-{side[0]}", RECEIVER, OUT)
    in_topic, out_topic = transport_queue_topic(ns, RECEIVER), transport_queue_topic(ns, OUT)
    preload(ctx, in_topic, n, order_body(ctx.params.body_bytes), f"{side}: {n:,} messages on {RECEIVER}")
    tmp = Path(tempfile.mkdtemp(prefix="kbroker-bench-outbox-"))
    engine = create_engine(f"sqlite:///{tmp / 'app.db'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(CREATE)
        outbox = outbox_class(engine) if side == "kbroker" else None
        clock = Clock()
        handler = outbox_handler(clock) if outbox is not None else plain_handler(clock, engine)
        ep = TransportEndpoint(
            RECEIVER,
            cluster=ctx.cluster,
            namespace=ns,
            secondary=False,
            concurrency=MODEL,
            max_concurrency=CONCURRENCY,
            outbox=outbox,
        )
        what = "with an outbox" if outbox is not None else "without an outbox"
        deadline = time.monotonic() + 120 + n / 5  # 5 msg/s at least (measured: 12-45 on 2 loaded cores)
        gc.collect()
        t_start = time.perf_counter()
        try:
            ep.start(handler)
            wait_committed(ctx, ep, n, clock, f"{side}: {what}, {MODEL}, max_concurrency {CONCURRENCY}", deadline)
            counters = ep.stats()["counters"]
        finally:
            ep.close()  # after the last handler's outbox row is marked dispatched
        detail: dict[str, Any] = clock.detail(n, t_start)
        detail["ms_per_msg"] = detail["seconds"] * 1000 / n
        detail.update(failed=counters.get("failed", 0), rolled_back=counters.get("rolled_back", 0))
        with engine.connect() as conn:
            rows, distinct = conn.exec_driver_sql(COUNT).one()
        written = read_topic_to_end(ctx.cluster, out_topic, timeout=120)
        detail.update(out_messages=written, db_rows=rows)
        wrong = written != n or rows != n or distinct != n
        if outbox is not None:
            kept = outbox.rows()
            undispatched = sum(1 for r in kept if r["dispatched_at"] is None)
            detail.update(outbox_rows=len(kept), undispatched=undispatched)
            wrong = wrong or len(kept) != n or undispatched > 0
        if wrong:
            raise RuntimeError(
                f"{side} ({what}): {written:,} messages on {OUT}, {rows:,} rows ({distinct:,} distinct) "
                f"for {n:,} handled: {detail}"
            )
        return {"value": clock.rate(n), "detail": detail}
    finally:
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


def run_outbox(ctx: BenchContext, tools: Any, rep: int) -> dict[str, dict]:
    n = ctx.params.outbox_messages
    ctx.say(
        f"transport-outbox: {n:,} messages a side, a SQLite INSERT and a send each, "
        f"{MODEL} with max_concurrency {CONCURRENCY}"
    )
    return {"transport-outbox": side_by_side(rep, lambda side: measure_outbox(ctx, tools, side, n))}


def extra_ms(outbox_rate: float, plain_rate: float) -> float:
    """The outbox's extra cost per message, in ms, from the two rates (msg/s)."""
    return (1 / outbox_rate - 1 / plain_rate) * 1000


def _summary(out: dict) -> None:
    k, b = out.get("kbroker"), out.get("baseline")
    if k and b:
        out["summary"] = (
            f"msg/s: with the outbox {k:,.0f}, without {b:,.0f}; the outbox costs "
            f"{extra_ms(k, b):,.2f} ms a message more ({1000 / k:,.2f} against {1000 / b:,.2f} ms); "
            f"{OUT} held exactly N on both sides"
        )


scenario(
    Scenario(
        name="transport-outbox",
        description="the transport face's outbox: a handler's SQLite write and send, exactly once, "
        "against the same handler without it",
        rows=(
            Row(
                "transport-outbox",
                "msg/s",
                f"ratio >= {TARGET}",
                check=lambda r: r["ratio"] >= TARGET,
                floor=Floor(FLOOR, cpu=6.0),
                baseline_code="kbroker/bench/scenarios/transport_outbox.py:plain_handler; "
                "kbroker/bench/scenarios/transport_outbox.py:measure_outbox",
                notes="N messages (--outbox-messages) preloaded on Billing; an endpoint of Billing started with "
                f"concurrency={MODEL}, max_concurrency={CONCURRENCY}, its handler one INSERT into a SQLite "
                f"database and one tx.send('{OUT}', body); kbroker: with outbox=Outbox(engine), the INSERT "
                "through tx.db; baseline: kbroker without an outbox, the INSERT in its own engine.begin() "
                "block. Timed from the first message handed out to the last committed; Out is checked to "
                "hold exactly N, the table N rows (and the outbox N rows, all dispatched)",
                finish=_summary,
            ),
        ),
        run=run_outbox,
        setup=database_tools,
    )
)
