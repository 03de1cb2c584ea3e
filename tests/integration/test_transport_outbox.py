"""The transport face's transaction modes and its outbox (core/transport/transaction_modes.py,
sdk/transport/handling.py, sdk/transport/outbox.py) against the real broker and a real SQLite
database: ReceiveOnly and None as NServiceBus has them; with an outbox, the handler's database
write and its sends happen exactly once, duplicates of the message are dropped, and a kill -9
between the database commit and the dispatch loses and duplicates nothing, for the thread
endpoint's Outbox and the asyncio endpoint's AsyncOutbox alike (test_transport_aio_outbox.py:
the asyncio one's handling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import Recoverability
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.outbox import Outbox
from tests.helpers import ROOT

NO_DELAYED = Recoverability(immediate_retries=1, delayed_retries=0)


def drain(ep: TransportEndpoint, seconds: float) -> list[TransportMessage]:
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        msg = ep.receive(0.3)
        if msg is not None:
            got.append(msg)
    return got


def test_receive_only_and_none(endpoints: Callable[..., TransportEndpoint]) -> None:
    calls: Counter[bytes | None] = Counter()

    def handle(msg: TransportMessage, tx: Any) -> None:
        calls[msg.body] += 1
        tx.send("Out", msg.body)
        if msg.body == b"fails once" and calls[msg.body] == 1:
            raise RuntimeError("first time")
        if msg.body == b"always fails":
            raise RuntimeError("always")

    out = endpoints("Out")
    ro = endpoints("ReceiveOnly", transaction_mode="ReceiveOnly", recoverability=NO_DELAYED).start(handle)
    ro.send("ReceiveOnly", b"fails once")
    got = drain(out, 6)
    assert [m.body for m in got] == [b"fails once"] and calls[b"fails once"] == 2  # a failure sends nothing
    none = endpoints("AtMostOnce", transaction_mode=transport_mode_none()).start(handle)
    none.send("AtMostOnce", b"always fails")
    none.send("AtMostOnce", b"fine")
    got = drain(out, 6)
    assert [m.body for m in got] == [b"fine"]
    assert calls[b"always fails"] == 1 and none.stats()["counters"]["lost"] == 1  # removed before: never again
    with pytest.raises(InvalidArgumentError, match="transaction mode"):
        endpoints("Bad", transaction_mode="Sometimes", install=False)


def transport_mode_none() -> str:
    return "None"


def test_an_outbox_handler_writes_and_sends_once_and_drops_duplicates(
    endpoints: Callable[..., TransportEndpoint], tmp_path: Path
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (n TEXT NOT NULL)"))
    outbox = Outbox(engine)
    calls: Counter[bytes | None] = Counter()

    def handle(msg: TransportMessage, tx: Any) -> None:
        calls[msg.body] += 1
        tx.db.execute(sa.text("INSERT INTO orders (n) VALUES (:n)"), {"n": (msg.body or b"").decode()})
        tx.send("Out", msg.body)
        if msg.body == b"fails once" and calls[msg.body] == 1:
            raise RuntimeError("after the write: rolled back with it")

    out = endpoints("Out")
    billing = endpoints("Billing", outbox=outbox, recoverability=NO_DELAYED).start(handle)
    first = billing.send("Billing", b"a")
    billing.send("Billing", b"a again", message_id=first)  # a sender's duplicate: same Id
    billing.send("Billing", b"fails once")
    got = drain(out, 8)
    assert sorted(m.body for m in got) == [b"a", b"fails once"]
    with engine.connect() as conn:
        rows = sorted(r[0] for r in conn.execute(sa.text("SELECT n FROM orders")))
    assert rows == ["a", "fails once"]  # the failed attempt's write rolled back; the duplicate never ran
    assert calls == {b"a": 1, b"fails once": 2}
    assert billing.stats()["counters"]["duplicates_dropped"] == 1
    assert all(r["dispatched_at"] is not None for r in outbox.rows()) and len(outbox.rows()) == 2
    assert outbox.clean(now=time.time() + 8 * 24 * 3600) == 2 and outbox.rows() == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_kill_9_between_the_database_commit_and_the_dispatch_loses_and_duplicates_nothing(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str, tmp_path: Path, kind: str
) -> None:
    out = endpoints("Processed")
    sender = endpoints("Orders")
    db = tmp_path / "orders.db"
    for n in range(20):
        sender.send("Orders", json.dumps({"n": n}).encode())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def instance(machine: str, crash_at: int, log: Path) -> subprocess.Popen:
        with open(log, "w") as f:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.helpers.outbox_instance",
                    kafka_bootstrap,
                    namespace,
                    "Orders",
                    machine,
                    "Processed",
                    str(db),
                    str(crash_at),
                    kind,
                ],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    a = instance("a", 7, tmp_path / "a.log")
    a.wait(120)
    assert a.returncode == -9, (tmp_path / "a.log").read_text()[-2000:]  # it killed itself at 7
    b = instance("b", -1, tmp_path / "b.log")
    try:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while len({r["n"] for r in got}) < 20 and time.monotonic() < deadline:
            msg = out.receive(0.5)
            if msg is not None:
                got.append(json.loads(msg.body or b"{}"))
        got += [json.loads(m.body or b"{}") for m in drain(out, 3)]
    finally:
        b.terminate()
        b.wait(30)
    sent = Counter(r["n"] for r in got)
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        written = Counter(r[0] for r in conn.execute(sa.text("SELECT n FROM orders")))
        seven = conn.execute(sa.text("SELECT by FROM orders WHERE n = 7")).scalar_one()
    assert set(sent) == set(range(20)) and max(sent.values()) == 1, sent
    assert set(written) == set(range(20)) and max(written.values()) == 1, written
    assert seven == "a"  # written before the kill, dispatched by the next instance, never handled again
    assert [r["by"] for r in got if r["n"] == 7] == ["a"]  # the stored send itself
