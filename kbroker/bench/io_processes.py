"""io-bound from N processes on one machine: the same reader as the io-bound row (threads of one
Broker, each `with broker.transaction() as tx: tx.receive(top=10, wait=1)` then the handler),
started as N processes of `python -m kbroker.bench.io_processes`, which share the queue's
partitions (4) as members of its consumer group. One process's Python holds one core (the GIL);
N processes are how a user spreads the same reader over a machine's cores.

The messages are written once every process owns a partition, so the group's rebalances are not
timed. A child reads its settings as one JSON line on stdin (the cluster's settings may hold
credentials: not on its command line), prints `ready` once its receiver owns a partition and
`+n <epoch seconds>` per transaction committed, and on EOF on stdin stops, closes its Broker and
prints its CPU seconds and peak RSS as one JSON line."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from kbroker.bench.common import IO_DELAY, QUEUE, join_all
from kbroker.bench.usage import peak_rss_mb
from kbroker.core.cluster import Cluster
from kbroker.errors import KBrokerError


def _child() -> None:
    conf = json.loads(sys.stdin.readline())
    from kbroker.sdk.broker import Broker

    broker = Broker(Cluster.with_properties(conf["bootstrap"], conf["properties"]), conf["namespace"])
    stop, out = threading.Event(), threading.Lock()

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def reader() -> None:
        while not stop.is_set():
            try:
                with broker.transaction() as tx:
                    msgs = tx.receive(QUEUE, top=10, wait=0.2)
                    for _ in msgs:
                        time.sleep(IO_DELAY)
            except KBrokerError as exc:  # retriable here (a slow catalog read, an aborted commit)
                say(f"!{type(exc).__name__}")
                time.sleep(0.1)
                continue
            if msgs:
                say(f"+{len(msgs)} {time.time()}")

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(conf["readers"])]
    for t in threads:
        t.start()
    receiver = broker.runtime.receiver(QUEUE)
    while not receiver.stats()["partitions"]:
        time.sleep(0.05)
    say("ready")
    sys.stdin.read()  # until the parent closes it
    stop.set()
    join_all(threads, 10)
    broker.close()
    say(
        json.dumps(
            {
                "cpu_seconds": round(time.process_time(), 3),
                # VmHWM, not ru_maxrss: Linux carries the parent's high-water mark over fork and exec
                "peak_rss_mb": round(peak_rss_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


def measure_processes(
    cluster: Cluster,
    namespace: str,
    processes: int,
    readers: int,
    total: int,
    preload: Callable[[], object],
    deadline: float,
) -> dict[str, Any]:
    """Start `processes` readers of `readers` threads each, wait until each owns a partition,
    call `preload`, and time from the first message handled to the last one committed: the rate,
    and the CPU seconds and peak RSS of every process."""
    conf = json.dumps(
        {"bootstrap": cluster.bootstrap, "properties": cluster.properties, "namespace": namespace, "readers": readers}
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kbroker.bench.io_processes"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    lock, done, ready = threading.Lock(), [0], threading.Semaphore(0)
    first, last = [float("inf")], [0.0]
    finals: list[dict] = []
    errors: dict[str, int] = {}  # retried by the readers: their transactions rolled back

    def follow(p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("+"):
                n, at = line[1:].split()
                with lock:
                    done[0] += int(n)
                    first[0], last[0] = min(first[0], float(at) - int(n) * IO_DELAY), max(last[0], float(at))
            elif line.startswith("!"):
                with lock:
                    errors[line[1:].strip()] = errors.get(line[1:].strip(), 0) + 1
            elif line.startswith("ready"):
                ready.release()
            elif line.startswith("{"):
                finals.append(json.loads(line))

    followers = [threading.Thread(target=follow, args=(p,), daemon=True) for p in procs]
    try:
        for p, f in zip(procs, followers):
            assert p.stdin is not None
            p.stdin.write(conf + "\n")
            p.stdin.flush()
            f.start()
        for _ in procs:
            if not ready.acquire(timeout=max(1.0, deadline - time.monotonic())):
                raise RuntimeError(f"{processes} processes: not every one owned a partition in time")
        preload()
        while done[0] < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{processes} processes: only {done[0]:,} of {total:,} messages handled in time")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        join_all(followers, 5)
    seconds = last[0] - first[0]
    return {
        "value": total / seconds,
        "detail": {
            "processes": processes,
            "readers_per_process": readers,
            "seconds": seconds,
            "cpu_seconds": round(sum(f["cpu_seconds"] for f in finals), 3),
            "peak_rss_mb_per_process": [f["peak_rss_mb"] for f in finals],
            "retried_errors": errors,
        },
    }


if __name__ == "__main__":
    _child()
