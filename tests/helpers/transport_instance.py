"""One competing instance of a transport endpoint, in a process of its own (for kill -9 tests).

The instance reads the endpoint's primary queue (no secondary queue) and, for each message,
sends to `forward_to` in the same transaction `{"n": <the input's n>, "by": <machine>,
"p": <input partition>, "o": <input offset>}`, then sleeps `sleep_ms` before the commit: the
send and the removal of its input commit together, or neither does.

    python -m tests.helpers.transport_instance BOOTSTRAP NAMESPACE ENDPOINT MACHINE FORWARD_TO \
        SLEEP_MS MAX_CONCURRENCY STATS_FILE

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
) -> None:
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sleep = sleep_ms / 1000.0

    def handle(msg, tx) -> None:
        n = json.loads(msg.body)["n"]
        tx.send(forward_to, json.dumps({"n": n, "by": machine, "p": msg.partition, "o": msg.row_version}).encode())
        if sleep:
            time.sleep(sleep)

    ep = TransportEndpoint(
        endpoint,
        cluster=bootstrap,
        namespace=namespace,
        machine=machine,
        secondary=False,
        max_concurrency=max_concurrency,
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
    bootstrap_, namespace_, endpoint_, machine_, forward_to_, sleep_ms_, concurrency_, stats_file_ = sys.argv[1:]
    run(bootstrap_, namespace_, endpoint_, machine_, forward_to_, float(sleep_ms_), int(concurrency_), stats_file_)
