"""Failover time: three competing readers of one queue, one killed with SIGKILL.

    python -m kbroker.bench.failover --bootstrap HOST:PORT [--face transport|service] [--kills 3]
        [--messages 6000] [--cpu-load 2] [--json]

Each run makes a fresh namespace with a backlog and starts three reader processes. Transport
face: endpoint In (6 partitions), whose handler forwards each input's number, partition and
handling time to queue Out in the transaction that removes the input (Out, read_committed, is
exactly the committed handlings). Service Broker face: two RECEIVE threads per process on
ExpenseQueue (4 partitions, topics/samples), each printing a line after its commit. Once a
quarter is handled and the group has settled (every partition held, none moved for 1 s), one
reader is killed with SIGKILL; the run ends when every input was handled.

Per run: `gap_s`, the longest time one of the killed reader's partitions (those it held at the
kill) handled nothing (its last handling before the kill to its first by a survivor);
`takeover_s`, how long after the kill the last of them was given to a survivor (the group
protocol's share of the gap; the rest is waiting for a transaction the killed reader left open,
which Kafka aborts after transaction.timeout.ms); `rate`, handlings per second over the whole
run, and `steady_rate` before the kill; `moves`, when (s from the kill) a partition changed hands between two live
readers (after the kill: a false takeover); `expelled`, when the group expelled a live reader
after the kill (its session expired: the cause of a false takeover); `missing` and `duplicated`
inputs (0 on the transport face; on the other a kill between a commit and its line shows as
missing). `--cpu-load N` runs N busy loops beside. The readers take kbroker's queue consumer
settings (kafka/receive/group_protocol.py): KBROKER_GROUP_PROTOCOL=consumer compares the consumer
protocol, KBROKER_QUEUE_SESSION_TIMEOUT_MS another classic session time-out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from kbroker.bench.common import QUEUE, claim_headers, json_body
from kbroker.kafka.clients import idempotent_producer
from kbroker.kafka.snapshot import read_partitions, reading_consumer

PARTITIONS = 6
READERS = ("r0", "r1", "r2")
VICTIM = "r1"


def reader(bootstrap: str, namespace: str, machine: str, sleep_ms: float, owned_file: str) -> None:
    """One competing instance of endpoint In, forwarding to Out until SIGTERM; each change of
    the partitions it holds is a line of `owned_file`."""
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))

    def handle(msg: Any, tx: Any) -> None:
        n = json.loads(msg.body)["n"]
        tx.send("Out", json.dumps({"n": n, "by": machine, "p": msg.partition, "t": time.time()}).encode())
        time.sleep(sleep_ms / 1000.0)

    ep = TransportEndpoint(
        "In", cluster=bootstrap, namespace=namespace, machine=machine, secondary=False, max_concurrency=2
    )
    ep.start(handle)
    _report_owned(ep.runtime.receivers, "In", owned_file, stop)
    ep.stop()
    ep.close()


def service_reader(bootstrap: str, namespace: str, machine: str, sleep_ms: float, owned_file: str) -> None:
    """One process of two reader threads on ExpenseQueue (the Service Broker face): RECEIVE TOP(1)
    in a transaction, wait, commit; after each commit a line {n, by, p, t} on stdout."""
    from kbroker.errors import KBrokerError
    from kbroker.sdk.broker import Broker

    broker = Broker(bootstrap, namespace)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    printing = threading.Lock()

    def read() -> None:
        while not stop[0]:
            try:
                with broker.transaction() as tx:
                    msgs = tx.receive(QUEUE, top=1, wait=0.5)
                    time.sleep(sleep_ms / 1000.0 if msgs else 0)
            except KBrokerError as exc:  # a commit fenced by a rebalance: received again elsewhere
                print(f"{machine}: {exc}", file=sys.stderr)
                continue
            lines = "".join(
                json.dumps({"n": json.loads(m.body)["n"], "by": machine, "p": m.partition, "t": time.time()}) + "\n"
                for m in msgs
            )  # committed now
            with printing:
                sys.stdout.write(lines)
                sys.stdout.flush()

    threads = [threading.Thread(target=read, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    _report_owned(broker.runtime.receivers, QUEUE, owned_file, stop)
    for t in threads:
        t.join(30)
    Path(owned_file + ".direct").write_text(str(broker.runtime.committer.direct_commits))
    broker.close()


def _report_owned(receivers: Callable[[], dict[Any, Any]], queue: str, owned_file: str, stop: list[bool]) -> None:
    """Until `stop`, a line of `owned_file` at each change of the queue's partitions held here
    or of the times the group expelled this process."""
    held: tuple[list[int], int] = ([], 0)
    with open(owned_file, "a", buffering=1) as out:
        while not stop[0]:
            receiver = next((r for r in receivers().values() if r.queue == queue), None)
            stats = receiver.stats() if receiver is not None else {"partitions": [], "waiting": []}
            now = (sorted(set(stats["partitions"]) | set(stats["waiting"])), stats.get("expelled", 0))
            if now != held:
                held = now
                out.write(json.dumps({"t": time.time(), "partitions": now[0], "expelled": now[1]}) + "\n")
            time.sleep(0.05)


def _install_service(bootstrap: str, namespace: str, n: int, per_dialog: int = 1) -> None:
    from kbroker.bench.harness import samples_dir
    from kbroker.core import names
    from kbroker.kafka.catalog.apply import apply_paths

    apply_paths(bootstrap, namespace, [samples_dir()])
    topic = names.queue_topic(namespace, QUEUE)
    producer = idempotent_producer(bootstrap, **{"linger.ms": 5})
    for i in range(n):
        if i % per_dialog == 0:
            conversation = str(uuid.uuid4())
        producer.produce(
            topic,
            key=conversation.encode(),
            value=json_body(100, n=i),
            headers=list(claim_headers(conversation, i % per_dialog)),
        )
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the backlog was not acknowledged within 60 s")


def _install(bootstrap: str, namespace: str, n: int) -> str:
    from kbroker.core.transport.endpoint import install_plan, transport_queue_topic
    from kbroker.core.transport.message import new_message, to_headers
    from kbroker.kafka.transport.queues import install

    install(bootstrap, namespace, install_plan("In", None, partitions=PARTITIONS))
    install(bootstrap, namespace, install_plan("Out", None, partitions=3))
    topic = transport_queue_topic(namespace, "In")
    producer = idempotent_producer(bootstrap, **{"linger.ms": 5})
    for i in range(n):
        msg = new_message(json.dumps({"n": i}).encode(), {}, now_ms=int(time.time() * 1000))
        producer.produce(topic, key=msg.id.encode(), value=msg.body, headers=list(to_headers(msg)))
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the backlog was not acknowledged within 60 s")
    return transport_queue_topic(namespace, "Out")


def handling(raw: bytes | str | None) -> dict[str, Any] | None:
    """One handling as a reader reported it ({n, by, p, t}); None for anything else: another
    client may write to the output queue, and a half-written log line is not a handling."""
    try:
        r = json.loads(raw or b"")
    except ValueError:
        return None
    if (
        not isinstance(r, dict)
        or not isinstance(r.get("by"), str)
        or not all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool) for k in ("n", "p"))
        or not (isinstance(r.get("t"), (int, float)) and not isinstance(r.get("t"), bool))
    ):
        return None
    return r


class _Tail:
    """The output queue read from its start, read_committed, without a group, a little more
    at each poll."""

    def __init__(self, bootstrap: str, topic: str):
        from kbroker.core import names

        self.topic = topic
        self.consumer = reading_consumer(bootstrap, names.reader_group_of(topic) or topic)
        self.positions = dict.fromkeys(range(3), 0)
        self.records: list[dict[str, Any]] = []

    def poll(self, seconds: float) -> None:
        # Up to the end as of now: it returns as soon as it is there (the deadline covers a
        # slow answer about the end offsets on a loaded machine).
        read = read_partitions(self.consumer, self.topic, self.positions, 30.0)
        self.positions.update(read.positions)
        self.records += [r for m in read.records if (r := handling(m.value())) is not None]
        if not read.records:
            time.sleep(seconds)

    def close(self) -> None:
        self.consumer.close()


class _Logs:
    """The Service Broker face's handlings: the lines its readers print after each commit (a
    kill between a commit and its line shows as one input missing)."""

    def __init__(self, work: Path, machines: tuple[str, ...]):
        self.files = [work / f"{m}.log" for m in machines]
        self.records: list[dict[str, Any]] = []

    def poll(self, seconds: float) -> None:
        time.sleep(seconds)
        records: list[dict[str, Any]] = []
        for f in self.files:
            if f.exists():
                text = f.read_text()
                records += [
                    r
                    for line in text[: text.rfind("\n") + 1].splitlines()  # whole lines
                    if (r := handling(line)) is not None
                ]
        self.records = records

    def close(self) -> None:
        pass


def analyse(
    records: list[dict[str, Any]], n: int, killed_at: float, victim: str = VICTIM, victim_held: list[int] | None = None
) -> dict[str, Any]:
    """The figures of one run from its committed handlings (see the module docstring).
    `victim_held`: the partitions the killed reader reported holding at the kill; without it,
    those whose last handling before the kill was the killed reader's. A partition given to it
    by a rebalance shortly before the kill may have no handling of its yet."""
    counts: dict[int, int] = {}
    for r in records:
        counts[r["n"]] = counts.get(r["n"], 0) + 1
    by_time = sorted(records, key=lambda r: r["t"])
    started = max(min(r["t"] for r in records if r["by"] == m) for m in {r["by"] for r in records})
    owner: dict[int, str] = {}
    last: dict[int, float] = {}
    gaps: dict[int, float] = {}
    moves: list[float] = []
    for r in by_time:
        p, by = r["p"], r["by"]
        before = owner.get(p)
        was_victims = p in victim_held if victim_held is not None else before == victim
        if was_victims and by != victim and r["t"] >= killed_at and p not in gaps:
            gaps[p] = r["t"] - last.get(p, killed_at)
        elif before not in (None, by, victim) and r["t"] > started:
            moves.append(round(r["t"] - killed_at, 2))  # a live process lost the partition to another
        owner[p], last[p] = by, r["t"]
    first, end = by_time[0]["t"], by_time[-1]["t"]
    before_kill = [r for r in by_time if r["t"] < killed_at]
    return {
        "gap_s": round(max(gaps.values()), 2) if gaps else None,
        "victim_partitions": sorted(gaps),
        "rate": round(len(counts) / (end - first), 1),
        "steady_rate": round(len(before_kill) / max(killed_at - first, 1e-3), 1),
        "moves": moves,
        "missing": n - len(counts),
        "duplicated": sum(c - 1 for c in counts.values()),
    }


def one_run(
    bootstrap: str, n: int, sleep_ms: float, face: str = "transport", timeout: float = 180.0, per_dialog: int = 1
) -> dict[str, Any]:
    """Install, start three readers, kill one a quarter of the way through, read to the end.
    `per_dialog`: the Service Broker face's messages per dialog (a dialog's first RECEIVE writes
    its target endpoint; the later ones commit with no Kafka transaction: `direct_commits`, the
    survivors' count)."""
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="kbroker-failover-"))
    tail: _Tail | _Logs
    partitions = PARTITIONS if face == "transport" else 4  # ExpenseQueue's, topics/samples
    if face == "transport":
        tail = _Tail(bootstrap, _install(bootstrap, namespace, n))
    else:
        _install_service(bootstrap, namespace, n, per_dialog)
        tail = _Logs(work, READERS)
    procs = {
        m: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbroker.bench.failover",
                f"{face}-reader",
                bootstrap,
                namespace,
                m,
                str(sleep_ms),
                str(work / m),
            ],
            stdout=(work / f"{m}.log").open("w"),
        )
        for m in READERS
    }
    killed_at = 0.0
    deadline = time.monotonic() + timeout
    try:
        while len({r["n"] for r in tail.records}) < n and time.monotonic() < deadline:
            tail.poll(0.2)
            if (
                not killed_at
                and len(tail.records) >= n // 4
                and any(r["by"] == VICTIM for r in tail.records)
                and settled(work, partitions)
            ):
                procs[VICTIM].send_signal(signal.SIGKILL)
                killed_at = time.time()
        tail.poll(2.0)  # a duplicate committed late would show now
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        tail.close()
    changes = owned(work)
    result = analyse(tail.records, n, killed_at, victim_held=held_at(changes[VICTIM], killed_at))
    result["takeover_s"] = takeover(changes, result["victim_partitions"], killed_at)
    result["expelled"] = expelled(changes, killed_at)
    counts = [work / f"{m}.direct" for m in READERS]
    result["direct_commits"] = sum(int(f.read_text() or 0) for f in counts if f.exists())
    shutil.rmtree(work, ignore_errors=True)
    return result


Changes = dict[str, list[dict[str, Any]]]  # each reader's reports, in order: {"t", "partitions", "expelled"}


def owned(work: Path) -> Changes:
    """What each reader reported of the partitions it held (a line of its file at each change)."""
    return {
        m: [json.loads(line) for line in (work / m).read_text().splitlines()] if (work / m).exists() else []
        for m in READERS
    }


def settled(work: Path, partitions: int, quiet: float = 1.0) -> bool:
    """Whether the three readers hold every partition between them, none twice, and the last
    change is `quiet` s old: a kill then meets a settled group, so a later move is its doing."""
    lasts = [reports[-1] if reports else None for reports in owned(work).values()]
    if not all(last and last["partitions"] for last in lasts):
        return False
    held = sorted(p for last in lasts if last for p in last["partitions"])
    return held == list(range(partitions)) and time.time() - max(last["t"] for last in lasts if last) >= quiet


def held_at(reports: list[dict[str, Any]], at: float) -> list[int]:
    """The partitions a reader last reported holding at `at` (none if it reported nothing)."""
    held: list[int] = []
    for change in reports:
        if change["t"] <= at:
            held = change["partitions"]
    return held


def takeover(changes: Changes, partitions: list[int], killed_at: float) -> float | None:
    """How long after the kill the last of `partitions` was given to a survivor: the group
    protocol's part of the gap (the rest is waiting for the dead process's open transaction)."""
    given: dict[int, float] = {}
    for m, reports in changes.items():
        for change in reports if m != VICTIM else ():
            for p in change["partitions"]:
                if p in partitions and change["t"] >= killed_at:
                    given[p] = min(given.get(p, change["t"]), change["t"])
    return round(max(given.values()) - killed_at, 2) if len(given) == len(partitions) and given else None


def expelled(changes: Changes, killed_at: float) -> list[float]:
    """When (s from the kill) the group expelled a live reader, its session expired (say the
    machine stalled it past the session time-out): a move after the kill follows one."""
    times: list[float] = []
    for m, reports in changes.items():
        count = 0
        for change in reports if m != VICTIM else ():
            if change.get("expelled", 0) > count and change["t"] >= killed_at:
                times.append(round(change["t"] - killed_at, 2))
            count = change.get("expelled", 0)
    return sorted(times)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("transport-reader", "service-reader"):
        (reader if args[0] == "transport-reader" else service_reader)(
            args[1], args[2], args[3], float(args[4]), args[5]
        )
        return 0
    ap = argparse.ArgumentParser(prog="python -m kbroker.bench.failover", description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--kills", type=int, default=3, help="runs, one kill each")
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--sleep-ms", type=float, default=2.0, help="each handling's wait, in its transaction")
    ap.add_argument("--cpu-load", type=int, default=0, help="busy-loop processes beside the readers")
    ap.add_argument(
        "--face",
        choices=("transport", "service"),
        default="transport",
        help="transport queue readers, or Service Broker RECEIVE on ExpenseQueue",
    )
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args(args)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(opts.cpu_load)]
    try:
        runs = [one_run(opts.bootstrap, opts.messages, opts.sleep_ms, opts.face) for _ in range(opts.kills)]
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    summary: dict[str, Any] = {
        "runs": runs,
        "protocol": os.environ.get("KBROKER_GROUP_PROTOCOL", "auto"),
        "cpu_load": opts.cpu_load,
        "face": opts.face,
    }
    for key in ("gap_s", "takeover_s", "rate", "steady_rate"):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    summary["moves"] = sum(len(r["moves"]) for r in runs)
    summary["expelled"] = sum(len(r["expelled"]) for r in runs)
    summary["lost_or_duplicated"] = sum(r["missing"] + r["duplicated"] for r in runs)
    print(json.dumps(summary) if opts.json else json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
