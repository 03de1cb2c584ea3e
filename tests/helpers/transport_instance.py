"""One competing instance of a transport endpoint, in a process of its own (for kill -9 tests).

The instance reads the endpoint's primary queue (no secondary queue) and, for each message,
sends to `forward_to` in the same transaction `{"n": <the input's n>, "by": <machine>,
"p": <input partition>, "o": <input offset>, "kind": "done"}`, then sleeps `sleep_ms` before
the commit: the send and the removal of its input commit together, or neither does.

With DELAY_EVERY > 0, an input whose n is a multiple of it is deferred instead: the handler sends
the endpoint itself `{"n": n, "delayed": true}` with a delay of 0.3-1.5 s (delayed delivery,
moved by the instances' delayed-store movers) and forwards `kind: "deferred"`; the delayed
message, when it comes, is forwarded as `kind: "done"`. With PUBLISH_EVERY > 0, the handling that
makes a multiple of it done also publishes an `OrderAccepted` event `kind: "published"` in the
same transaction (to its subscribers: the test subscribes FORWARD_TO's endpoint). With
RETRY_EVERY > 0, a first delivery of a multiple of it fails (raises): the endpoint's
recoverability (no immediate retries, one delayed retry 0.5 s later) brings it back through the
delayed store, and it is handled then. Every message handled is audited to the `Audited` queue.

    python -m tests.helpers.transport_instance BOOTSTRAP NAMESPACE ENDPOINT MACHINE FORWARD_TO \
        SLEEP_MS MAX_CONCURRENCY STATS_FILE [DELAY_EVERY [PUBLISH_EVERY [RETRY_EVERY]]]

It runs until SIGTERM (or SIGINT): then it closes the endpoint (commits what is pending) and
writes its stats to STATS_FILE as JSON. SIGKILL, of course, leaves no stats.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path


def run(
    bootstrap: str,
    namespace: str,
    endpoint: str,
    machine: str,
    forward_to: str,
    sleep_ms: float,
    max_concurrency: int,
    stats_file: str,
    delay_every: int = 0,
    publish_every: int = 0,
    retry_every: int = 0,
) -> None:
    from kbroker.core.transport.recoverability import RETRIES, Recoverability
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sleep = sleep_ms / 1000.0

    def handle(msg, tx) -> None:
        body = json.loads(msg.body)
        n = body["n"]
        if retry_every and n % retry_every == 0 and not body.get("delayed") and RETRIES not in msg.headers:
            raise RuntimeError(f"the first delivery of {n} fails")
        kind = "done"
        if delay_every and n % delay_every == 0 and not body.get("delayed"):
            kind = "deferred"
            tx.send(endpoint, json.dumps({"n": n, "delayed": True}).encode(), delay=0.3 + (n % 7) * 0.2)
        record = {"n": n, "by": machine, "p": msg.partition, "o": msg.row_version, "kind": kind}
        tx.send(forward_to, json.dumps(record).encode())
        if publish_every and kind == "done" and n % publish_every == 0:
            tx.publish("OrderAccepted", json.dumps({**record, "kind": "published"}).encode())
        if sleep:
            time.sleep(sleep)

    ep = TransportEndpoint(
        endpoint,
        cluster=bootstrap,
        namespace=namespace,
        machine=machine,
        secondary=False,
        max_concurrency=max_concurrency,
        recoverability=Recoverability(immediate_retries=0, delayed_retries=1, time_increase=0.5),
        audit_queue="Audited",
    )
    started = time.monotonic()
    ep.start(handle)
    print(f"instance {machine} started (pid in parent's hands)", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        pass
    ep.stop()
    stats = ep.stats()
    ep.close()
    stats["seconds"] = round(time.monotonic() - started, 3)
    Path(stats_file).write_text(json.dumps(stats, default=str))
    print(f"instance {machine} stopped: {stats['counters']}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    bootstrap_, namespace_, endpoint_, machine_, forward_to_, sleep_ms_, concurrency_, stats_file_ = sys.argv[1:9]
    every_ = int(sys.argv[9]) if len(sys.argv) > 9 else 0
    run(
        bootstrap_,
        namespace_,
        endpoint_,
        machine_,
        forward_to_,
        float(sleep_ms_),
        int(concurrency_),
        stats_file_,
        every_,
        int(sys.argv[10]) if len(sys.argv) > 10 else 0,
        int(sys.argv[11]) if len(sys.argv) > 11 else 0,
    )
