"""One instance of an outbox endpoint, in a process of its own (the kill -9 test of
tests/integration/test_transport_outbox.py). For each message `{"n": n}` of ENDPOINT, the handler
INSERTs (n) into table `orders` of the SQLite database DB_PATH through `tx.db` and sends `{"n": n}`
to FORWARD_TO; the outbox stores the send in the same database transaction. With CRASH_AT = n,
the process kills itself with SIGKILL once that message's database transaction committed and
before its dispatch. KIND `threads` runs the thread endpoint with an Outbox, `asyncio` the asyncio
endpoint with an AsyncOutbox (aiosqlite) and a coroutine handler.

    python -m tests.helpers.outbox_instance BOOTSTRAP NAMESPACE ENDPOINT MACHINE FORWARD_TO DB_PATH CRASH_AT [KIND]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from typing import Any


def run(
    bootstrap: str,
    namespace: str,
    endpoint: str,
    machine: str,
    forward_to: str,
    db_path: str,
    crash_at: int,
    kind: str = "threads",
) -> None:
    import sqlalchemy as sa

    from kbroker.sdk.transport.endpoint import TransportEndpoint
    from kbroker.sdk.transport.outbox import Outbox

    engine = sa.create_engine(f"sqlite:///{db_path}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS orders (n INTEGER NOT NULL, by TEXT NOT NULL)"))
    numbers: dict[str, int] = {}

    def stored(message_id: str) -> None:
        if numbers.get(message_id) == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # between the database commit and the dispatch

    def handle(msg, tx) -> None:
        n = json.loads(msg.body)["n"]
        numbers[msg.id] = n
        tx.db.execute(sa.text("INSERT INTO orders (n, by) VALUES (:n, :by)"), {"n": n, "by": machine})
        tx.send(forward_to, json.dumps({"n": n, "by": machine}).encode())

    def endpoint_with(outbox: Any) -> TransportEndpoint:
        return TransportEndpoint(
            endpoint,
            cluster=bootstrap,
            namespace=namespace,
            machine=machine,
            secondary=False,
            outbox=outbox,
            max_concurrency=1,
            concurrency="fixed",
        )

    if kind == "asyncio":
        asyncio.run(run_async(endpoint_with, db_path, machine, forward_to, stored, numbers))
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ep = endpoint_with(Outbox(engine, on_stored=stored))
    ep.start(handle)
    print(f"outbox instance {machine} started", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        pass
    ep.close()


async def run_async(endpoint_with: Any, db_path: str, machine: str, forward_to: str, stored: Any, numbers: Any) -> None:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    from kbroker.sdk.transport.aio import AsyncTransportEndpoint
    from kbroker.sdk.transport.aio_outbox import AsyncOutbox

    async def handle(msg, tx) -> None:
        n = json.loads(msg.body)["n"]
        numbers[msg.id] = n
        await tx.db.execute(sa.text("INSERT INTO orders (n, by) VALUES (:n, :by)"), {"n": n, "by": machine})
        await tx.send(forward_to, json.dumps({"n": n, "by": machine}).encode())

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    outbox = AsyncOutbox(create_async_engine(f"sqlite+aiosqlite:///{db_path}"), on_stored=stored)
    ep = AsyncTransportEndpoint(await asyncio.to_thread(endpoint_with, outbox))
    await ep.start(handle)
    print(f"outbox instance {machine} (asyncio) started", file=sys.stderr, flush=True)
    await stop.wait()
    await ep.close()
    await outbox.engine.dispose()


if __name__ == "__main__":
    a = sys.argv[1:]
    run(a[0], a[1], a[2], a[3], a[4], a[5], int(a[6]), *a[7:8])
