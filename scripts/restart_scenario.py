#!/usr/bin/env python
"""The broker-restart scenario of issue 10, as a script: does a README reader loop ride through
`broker stop`, a pause, and `broker start` on the same ports and data dir?

    PYTHONPATH=. .venv/bin/python scripts/restart_scenario.py [--messages 2000] [--outage 5] [--json]

It starts its own embedded broker (free ports, a temporary data dir), applies the invariant
catalog (tests/data/invariants.yaml) in a fresh namespace, and runs, as separate processes:
  - a sender: dialogs, then their requests in order at `--rate` messages/s (SEND outside a
    transaction, which the issue found rides through the outage);
  - a reader: the README reader loop (a transaction per RECEIVE TOP(10), a reply recording what
    it received, commit; TransactionAbortedError and other retriable errors: try again);
  - with `--worker`, a `kbroker worker` on the namespace (reported alive or not; item 2 of the issue).
Once the reader has committed some of the load, the broker is stopped, `--outage` seconds pass,
and it starts again on the same ports and data dir. Nobody restarts any other process. The run
ends when every sent message was received or `--timeout` seconds after the restart; then the
invariant checker (tests/helpers/invariants.py) counts lost, duplicated and out-of-order messages
from what a read_committed consumer sees. A reader that does not stop when asked is reported hung,
with its threads' stacks (faulthandler) in the output directory.

Exit status: 0 when every count is 0 and every process kept running, 1 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's kbroker and tests.helpers


# --- the processes ---------------------------------------------------------------------------


def run_reader(bootstrap: str, namespace: str, stop_file: str, log_file: str) -> None:
    """The README reader loop, retrying what the SDK calls retriable, until `stop_file` exists."""
    from kbroker.errors import KBrokerError, TransactionAbortedError
    from kbroker.sdk.broker import Broker
    from tests.helpers import invariants as inv

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the orchestrator asks for stacks
    log = open(log_file, "a", buffering=1)  # noqa: SIM115 - line by line, open until the process exits
    broker = Broker(bootstrap, namespace)
    while not os.path.exists(stop_file):
        try:
            with broker.transaction() as tx:
                msgs = tx.receive("RequestQueue", top=10, wait=1)
                if msgs:
                    leased = time.time()
                    body = {
                        "pid": os.getpid(),
                        "reader": 0,
                        "leased": leased,
                        "conversation_id": msgs[0].conversation_id,
                        "group": msgs[0].conversation_group_id,
                        "seqs": [m.message_sequence_number for m in msgs],
                        "ids": [m.message_id for m in msgs],
                    }
                    tx.send(msgs[0].conversation_handle, inv.REPLY, body)
            if msgs:
                log.write(json.dumps({**body, "committed": tx.committed_at}) + "\n")
        except TransactionAbortedError as exc:
            log.write(json.dumps({"aborted": time.time(), "reason": str(exc)}) + "\n")
        except KBrokerError as exc:
            if not getattr(exc, "retriable", False):
                raise
            log.write(json.dumps({"retriable": time.time(), "reason": f"{type(exc).__name__}: {exc}"}) + "\n")
            time.sleep(0.1)
    broker.close()


def run_sender(
    bootstrap: str, namespace: str, conversations: int, per_conversation: int, rate: float, out_file: str
) -> None:
    """Begin the dialogs, then SEND request i on every dialog for i = 0, 1, ... at `rate` per s."""
    from kbroker.sdk.broker import Broker
    from tests.helpers import invariants as inv

    progress = Path(out_file + ".progress")
    sent: list[str] = []
    errors: list[str] = []
    with Broker(bootstrap, namespace) as broker:
        handles = [broker.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(conversations)]
        start = time.monotonic()
        for i in range(per_conversation):
            for h in handles:
                # Paced: the load is still arriving when the broker goes away.
                delay = start + len(sent) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                try:
                    sent.append(broker.send(h, inv.REQUEST, {"i": i}))
                except Exception as exc:  # noqa: BLE001 - reported, and the order check will fail
                    errors.append(f"{type(exc).__name__}: {exc}")
                if len(sent) % 100 == 0:
                    progress.write_text(str(len(sent)))
    Path(out_file).write_text(json.dumps({"sent": sent, "errors": errors}))


# --- the orchestrator --------------------------------------------------------------------------


def _spawn(args: list[str], out_dir: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    with open(out_dir / f"{name}.out", "w") as out:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from tests.helpers.invariants import read_logs

    return read_logs([path])


def scenario(opts: argparse.Namespace) -> dict[str, Any]:
    """Run the scenario once; the figures and counts as a dict."""
    from kbroker.core import names
    from kbroker.embedded.broker import EmbeddedBroker
    from kbroker.kafka.catalog.apply import apply_paths
    from tests.helpers import free_port
    from tests.helpers import invariants as inv

    work = Path(opts.dir or tempfile.mkdtemp(prefix="kbroker-restart-"))
    work.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedBroker(work / "kafka")
    port, cport = free_port(), free_port()
    namespace = "restart" + uuid.uuid4().hex[:8]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    py = [sys.executable, str(Path(__file__).resolve())]
    result: dict[str, Any] = {"dir": str(work), "namespace": namespace, "outage_s": opts.outage}
    procs: dict[str, subprocess.Popen] = {}
    try:
        bootstrap = embedded.start(port=port, controller_port=cport).bootstrap
        assert bootstrap is not None
        result["bootstrap"] = bootstrap
        apply_paths(bootstrap, namespace, [inv.YAML])
        stop_file, log_file, sent_file = work / "stop-reader", work / "reader.jsonl", work / "sent.json"
        procs["reader"] = _spawn(
            [*py, "_reader", bootstrap, namespace, str(stop_file), str(log_file)], work, "reader", env
        )
        if opts.worker:
            procs["worker"] = _spawn(
                [
                    sys.executable,
                    "-m",
                    "kbroker",
                    "worker",
                    "--bootstrap",
                    bootstrap,
                    "--namespace",
                    namespace,
                    "--web-port",
                    str(free_port()),
                ],
                work,
                "worker",
                env,
            )
        per_conv = max(1, opts.messages // opts.conversations)
        procs["sender"] = _spawn(
            [
                *py,
                "_sender",
                bootstrap,
                namespace,
                str(opts.conversations),
                str(per_conv),
                str(opts.rate),
                str(sent_file),
            ],
            work,
            "sender",
            env,
        )
        # The outage starts once the reader is demonstrably under load.
        deadline = time.monotonic() + 120
        while sum(len(e.get("ids", ())) for e in _read_jsonl(log_file)) < opts.messages // 4:
            if time.monotonic() > deadline or procs["reader"].poll() is not None:
                raise RuntimeError("the reader never got going (see reader.out)")
            time.sleep(0.1)
        stopped_at = time.time()
        embedded.stop()
        time.sleep(opts.outage)
        embedded.start(port=port, controller_port=cport)
        back_at = time.time()
        result["broker_down_s"] = round(back_at - stopped_at, 2)
        total = opts.conversations * per_conv
        deadline = time.monotonic() + opts.timeout
        replies: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            received = sum(len(e.get("ids", ())) for e in _read_jsonl(log_file))
            if received >= total and procs["sender"].poll() is not None:
                break
            time.sleep(0.5)
        stop_file.touch()
        try:
            procs["reader"].wait(timeout=30)
            result["reader_hung"] = False
        except subprocess.TimeoutExpired:
            result["reader_hung"] = True
            os.kill(procs["reader"].pid, signal.SIGUSR1)  # its stacks, to reader.out
            time.sleep(1)
        for name, proc in procs.items():
            result[f"{name}_exit"] = proc.poll()
        result["worker_alive"] = procs["worker"].poll() is None if "worker" in procs else None
        sender = json.loads(sent_file.read_text()) if sent_file.exists() else {"sent": [], "errors": ["no output"]}
        entries = _read_jsonl(log_file)
        commits = [e for e in entries if "ids" in e]
        aborts = [e for e in entries if "aborted" in e]
        after = sorted(e["committed"] for e in commits if e["committed"] and e["committed"] >= back_at)
        last = max((e["committed"] for e in commits if e["committed"]), default=back_at)
        replies = inv.read_replies(bootstrap, names.queue_topic(namespace, "ReplyQueue"))
        report = inv.check(set(sender["sent"]), replies, commits, per_conv)
        received_once = sum(len(r["ids"]) for r in replies)
        result.update(
            {
                "sent": len(sender["sent"]),
                "sender_errors": sender["errors"][:3],
                "received": received_once,
                "committed_transactions": report.committed,
                "lost": len(report.lost),
                "duplicated": len(report.duplicated),
                "order_violations": len(report.order_violations),
                "lock_violations": len(report.lock_violations),
                "aborted_transactions": len(aborts),
                "abort_reasons": sorted({a["reason"][:80] for a in aborts})[:5],
                "recovery_s": round(after[0] - back_at, 2) if after else None,
                "drained_s": round(last - back_at, 2) if received_once >= len(sender["sent"]) else None,
            }
        )
        result["ok"] = bool(
            report.ok()
            and not result["reader_hung"]
            and not sender["errors"]
            and len(sender["sent"]) == total
            and result["worker_alive"] in (None, True)
        )
        return result
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        embedded.stop(timeout=20)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_reader":
        run_reader(*sys.argv[2:6])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_sender":
        b, ns, convs, per, rate, out = sys.argv[2:8]
        run_sender(b, ns, int(convs), int(per), float(rate), out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="requests to send in all")
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--rate", type=float, default=150.0, help="requests sent per second")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds between stop and start")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds after the restart to wait for everything to be received"
    )
    parser.add_argument("--worker", action="store_true", help="also run a kbroker worker on the namespace")
    parser.add_argument("--dir", help="working directory (default: a new temporary one, kept)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    opts = parser.parse_args()
    result = scenario(opts)
    if opts.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
