"""The endpoint invariant run: two processes per side of the same dialogs.

Initiator side: a *sender* process sends requests round after round on every dialog (autocommit
and in transactions, some rolled back), and an *ender* process sends one request and ends each
dialog in a transaction, spread over the run. Target side: *reader* processes RECEIVE in
transactions and, in the same transaction, send what they received on an audit dialog of their
own (and END their side on an EndDialog). The audit queue, read with read_committed, is exactly
the committed receives, so the checker needs the processes' logs only for what was committed
on the sending side and for commit times.

    python -m tests.helpers.endpoint_runs sender|ender|reader BOOTSTRAP NAMESPACE ...
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from kbroker.core.catalog.models import END_DIALOG
from kbroker.kafka.snapshot import read_to_end
from tests.helpers.invariants import lock_violations

REQUEST, AUDIT = "//kbroker/test/Request", "//kbroker/test/Audit"
CLIENT, SERVER, AUDITOR = "//kbroker/test/Client", "//kbroker/test/Server", "//kbroker/test/Auditor"
REQUESTS, AUDIT_CONTRACT = "//kbroker/test/Requests", "//kbroker/test/Audit"
YAML = Path(__file__).resolve().parent.parent / "data" / "endpoint_run.yaml"


def _spill_report(broker, log_file: str) -> None:
    """What the process's endpoint cache moved to disk and read back (the run's HOT setting)."""
    Path(log_file + ".spill").write_text(json.dumps(broker.runtime.endpoints.spill_counts()))


def _log(path: str):
    return open(path, "a", buffering=1)


def sender(bootstrap: str, namespace: str, handles_file: str, stop_file: str, log_file: str, seed: int) -> None:
    """Round after round, one request on every dialog not known to be ended; every 4th in a
    transaction, a tenth of those rolled back."""
    from kbroker.errors import ConversationClosedError, TransactionAbortedError, TransactionInDoubtError
    from kbroker.sdk.broker import Broker

    rng = random.Random(seed)
    handles = Path(handles_file).read_text().split()
    ended: set[str] = set()
    log = _log(log_file)
    with Broker(bootstrap, namespace) as broker:
        n = 0
        while not os.path.exists(stop_file) and len(ended) < len(handles):
            for h in rng.sample(handles, len(handles)):
                if h in ended or os.path.exists(stop_file):
                    continue
                n += 1
                try:
                    if n % 4:
                        mid = broker.send(h, REQUEST, {"n": n})
                        log.write(json.dumps({"id": mid, "handle": h}) + "\n")
                        continue
                    tx = broker.transaction()
                    mid = tx.send(h, REQUEST, {"n": n, "tx": True})
                    if rng.random() < 0.1:
                        tx.rollback()
                        continue
                    try:
                        tx.commit()
                        log.write(json.dumps({"id": mid, "handle": h}) + "\n")
                    except TransactionInDoubtError:
                        log.write(json.dumps({"id": mid, "handle": h, "doubt": True}) + "\n")
                    except TransactionAbortedError:
                        pass
                except ConversationClosedError:
                    ended.add(h)  # the ender got there first: nothing was sent
            time.sleep(0.05)
        _spill_report(broker, log_file)


def ender(bootstrap: str, namespace: str, handles_file: str, log_file: str, seed: int, spread: float) -> None:
    """One request and END CONVERSATION per dialog in one transaction, over `spread` seconds."""
    from kbroker.sdk.broker import Broker

    rng = random.Random(seed)
    handles = Path(handles_file).read_text().split()
    log = _log(log_file)
    with Broker(bootstrap, namespace) as broker:
        for h in rng.sample(handles, len(handles)):
            time.sleep(rng.uniform(0, 2 * spread / len(handles)))
            with broker.transaction() as tx:
                mid = tx.send(h, REQUEST, {"from": "ender"})
                tx.end_conversation(h)
            log.write(json.dumps({"id": mid, "handle": h, "ended": True}) + "\n")
        _spill_report(broker, log_file)


def reader(bootstrap: str, namespace: str, readers: int, stop_file: str, log_file: str, seed: int) -> None:
    from kbroker.errors import QueueDisabledError, TransactionAbortedError
    from kbroker.sdk.broker import Broker

    broker = Broker(bootstrap, namespace)
    log = _log(log_file)
    lock = threading.Lock()

    def run(idx: int) -> None:
        rng = random.Random(seed * 100 + idx)
        audit = broker.begin_dialog(SERVER, AUDITOR, AUDIT_CONTRACT)
        while not os.path.exists(stop_file):
            tx = broker.transaction()
            try:
                msgs = tx.receive("RequestQueue", top=2, wait=0.5)
                if not msgs:
                    tx.rollback()
                    continue
                leased = time.time()
                body = {
                    "pid": os.getpid(),
                    "reader": idx,
                    "leased": leased,
                    "conversation_id": msgs[0].conversation_id,
                    "group": msgs[0].conversation_group_id,
                    "seqs": [m.message_sequence_number for m in msgs],
                    "types": [m.message_type_name for m in msgs],
                    "ids": [m.message_id for m in msgs],
                }
                tx.send(audit, AUDIT, body)
                if any(m.message_type_name == END_DIALOG for m in msgs):
                    tx.end_conversation(msgs[0].conversation_handle)
                if rng.random() < 0.05:
                    tx.rollback()
                    continue
                body["committing"] = time.time()
                tx.commit()
                with lock:
                    log.write(json.dumps({**body, "committed": tx.committed_at}) + "\n")
            except TransactionAbortedError:
                pass  # a rebalance moved the partition: the new owner receives these again
            except QueueDisabledError:
                tx.rollback()
                time.sleep(0.2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _spill_report(broker, log_file)
    broker.close()


def read_audit(bootstrap: str, topic: str) -> list[dict]:
    records = read_to_end(bootstrap, topic, 30, must_finish=True) or []
    return [orjson.loads(m.value() or b"") for m in records]


def read_logs(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        if p.exists():
            for line in p.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by kill -9
    return out


@dataclass
class Report:
    sent: int = 0
    ended: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    after_end: list[str] = field(default_factory=list)
    ends_missing: list[str] = field(default_factory=list)
    lock_violations: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: (len(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}

    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.unknown
            or self.order_violations
            or self.after_end
            or self.ends_missing
            or self.lock_violations
        )


def check(send_logs: list[dict], audits: list[dict], reader_logs: list[dict]) -> Report:
    committed = {e["id"] for e in send_logs if not e.get("doubt")}
    doubtful = {e["id"] for e in send_logs if e.get("doubt")}
    ended = {e["handle"] for e in send_logs if e.get("ended")}
    r = Report(sent=len(committed), ended=len(ended))
    seen: dict[str, int] = defaultdict(int)
    by_conv: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for a in audits:
        for mid, seq, typ in zip(a["ids"], a["seqs"], a["types"]):
            by_conv[a["conversation_id"]].append((a["leased"], seq, typ))
            if typ != END_DIALOG:
                seen[mid] += 1
    r.lost = sorted(committed - set(seen))
    r.duplicated = sorted(m for m, n in seen.items() if n > 1)
    r.unknown = sorted(set(seen) - committed - doubtful)
    ends = 0
    for conv, got in by_conv.items():
        got.sort()  # receive order: by when each batch was taken (a group is held by one at a time)
        seqs = [s for _, s, _ in got]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            r.order_violations.append(f"{conv}: {seqs}")
        elif seqs != list(range(seqs[0], seqs[0] + len(seqs))) or seqs[0] != 0:
            r.gaps.append(f"{conv}: {seqs}")
        types = [t for _, _, t in got]
        if END_DIALOG in types:
            ends += 1
            if types.index(END_DIALOG) != len(types) - 1:
                r.after_end.append(f"{conv}: {types}")
    if ends != len(ended):
        r.ends_missing.append(f"{len(ended)} dialogs ended, {ends} EndDialogs received")
    r.lock_violations = lock_violations(reader_logs)
    return r


if __name__ == "__main__":
    mode, bootstrap, namespace, *rest = sys.argv[1:]
    if mode == "sender":
        handles_file, stop_file, log_file, seed = rest
        sender(bootstrap, namespace, handles_file, stop_file, log_file, int(seed))
    elif mode == "ender":
        handles_file, log_file, seed, spread = rest
        ender(bootstrap, namespace, handles_file, log_file, int(seed), float(spread))
    else:
        readers, stop_file, log_file, seed = rest
        reader(bootstrap, namespace, int(readers), stop_file, log_file, int(seed))
