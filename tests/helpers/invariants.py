"""Invariant checking over real multi-process runs (G1, G2).

Reader processes (`python -m tests.helpers.invariants reader ...`) run several reader threads that each
loop: RECEIVE TOP(2) from RequestQueue in a transaction, sleep a little, SEND one reply that
records what was received, then commit, or roll back at random. The replies that Kafka shows a
read_committed consumer are exactly the committed transactions, so the checker needs no trust in
the readers' own logs, except for commit times (written after commit returns), which it uses to
check that no two committed transactions held one group at once.
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

from kbroker.kafka.snapshot import read_to_end

REQUEST, REPLY = "//kbroker/test/Request", "//kbroker/test/Reply"
CLIENT, SERVER = "//kbroker/test/Client", "//kbroker/test/Server"
CONTRACT = "//kbroker/test/RequestReply"
YAML = Path(__file__).resolve().parent.parent / "data" / "invariants.yaml"


class Rollback(Exception):
    pass


def reader_process(
    bootstrap: str, namespace: str, readers: int, stop_file: str, log_file: str, rollback_rate: float, seed: int
) -> None:
    from kbroker.errors import QueueDisabledError, TransactionAbortedError
    from kbroker.sdk.broker import Broker

    broker = Broker(bootstrap, namespace)
    log = open(log_file, "a", buffering=1)  # noqa: SIM115 - line by line, open until the process exits
    lock = threading.Lock()

    def reader(idx: int) -> None:
        rng = random.Random(seed * 100 + idx)
        while not os.path.exists(stop_file):
            tx = broker.transaction()
            try:
                msgs = tx.receive("RequestQueue", top=2, wait=0.5)
                if not msgs:
                    tx.rollback()
                    continue
                leased = time.time()
                time.sleep(rng.uniform(0, 0.02))
                body = {
                    "pid": os.getpid(),
                    "reader": idx,
                    "leased": leased,
                    "conversation_id": msgs[0].conversation_id,
                    "group": msgs[0].conversation_group_id,
                    "seqs": [m.message_sequence_number for m in msgs],
                    "ids": [m.message_id for m in msgs],
                }
                tx.send(msgs[0].conversation_handle, REPLY, body)
                if rng.random() < rollback_rate:
                    raise Rollback()
                body["committing"] = time.time()
                tx.commit()
                with lock:
                    log.write(json.dumps({**body, "committed": tx.committed_at}) + "\n")
            except Rollback:
                tx.rollback()
            except TransactionAbortedError:
                pass  # a rebalance moved the partition: the new owner receives these again
            except QueueDisabledError:
                tx.rollback()
                time.sleep(0.2)  # ALTER QUEUE ... STATUS = OFF: wait for it to be enabled again

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    broker.close()


def send_requests(broker, conversations: int, per_conversation: int) -> set[str]:
    """Begin `conversations` dialogs and send `per_conversation` requests on each, in
    transactions of 50 dialogs (group commit keeps this quick)."""
    ids: set[str] = set()
    for start in range(0, conversations, 50):
        with broker.transaction() as tx:
            for _ in range(min(50, conversations - start)):
                h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
                for i in range(per_conversation):
                    ids.add(tx.send(h, REQUEST, {"i": i}))
    return ids


def read_replies(bootstrap: str, topic: str, timeout: float = 30.0) -> list[dict]:
    """Every committed reply, read to the end with a read_committed consumer."""
    records = read_to_end(bootstrap, topic, timeout, must_finish=True) or []
    return [orjson.loads(m.value() or b"") for m in records]  # an empty reply fails to parse: a bug


@dataclass
class Report:
    sent: int = 0
    committed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    lock_violations: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.order_violations or self.lock_violations or self.unknown)


def check(sent_ids: set[str], replies: list[dict], commit_logs: list[dict], per_conversation: int) -> Report:
    r = Report(sent=len(sent_ids), committed=len(replies))
    seen: dict[str, int] = defaultdict(int)
    for rep in replies:
        for mid in rep["ids"]:
            seen[mid] += 1
    r.lost = sorted(sent_ids - set(seen))
    r.duplicated = sorted(m for m, n in seen.items() if n > 1)
    r.unknown = sorted(set(seen) - sent_ids)
    # Order: a conversation's committed batches, in the order they were leased, are 0..n-1.
    by_conv: dict[str, list[dict]] = defaultdict(list)
    for rep in replies:
        by_conv[rep["conversation_id"]].append(rep)
    for conv, reps in by_conv.items():
        seqs = [s for rep in sorted(reps, key=lambda x: x["leased"]) for s in rep["seqs"]]
        if seqs != list(range(per_conversation)):
            r.order_violations.append(f"{conv}: {seqs}")
    r.lock_violations = lock_violations(commit_logs)
    return r


def lock_violations(commit_logs: list[dict]) -> list[str]:
    """G1: committed holds of one group never overlap. A hold runs from its lease to its release,
    and where the release lies depends on who takes the group next. Another reader thread of the
    same process waits on the process's group lock, which lets go when commit returns. A reader of
    another process can only read past the hold's messages once the broker has committed the
    transaction's offsets, somewhere between the commit call and its return; the return may come
    much later (an in-doubt commit settled after a stall), so the commit call is the release that
    can be proved. A reader that took the group earlier would receive the hold's messages again,
    which the lost/duplicated/order counts catch."""
    violations = []
    by_group: dict[str, list[dict]] = defaultdict(list)
    for entry in commit_logs:
        by_group[entry["group"]].append(entry)
    for group, entries in by_group.items():
        entries.sort(key=lambda e: e["leased"])
        for a, b in zip(entries, entries[1:]):
            released = a["committed"] if a["pid"] == b["pid"] else a["committing"]
            if b["leased"] < released:
                violations.append(f"{group}: {a['pid']}/{a['reader']} and {b['pid']}/{b['reader']}")
    return violations


def hold_overlaps(holds: list[dict]) -> list[str]:
    """Two transactions holding one group at once: each hold is {"group", "start", "end", "who"},
    from when its locking statement returned to just before its commit or rollback was called
    (inside the true hold, so an overlap of these is an overlap of the holds). Every pair of
    holds of a group that overlap, once."""
    overlaps = []
    by_group: dict[str, list[dict]] = defaultdict(list)
    for h in holds:
        by_group[h["group"]].append(h)
    for group, hs in by_group.items():
        hs.sort(key=lambda h: h["start"])
        for i, a in enumerate(hs):
            for b in hs[i + 1 :]:
                if b["start"] >= a["end"]:
                    break
                overlaps.append(f"{group}: {a['who']} and {b['who']}")
    return overlaps


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


if __name__ == "__main__":
    if sys.argv[1] == "reader":
        _, _, bootstrap, namespace, readers, stop_file, log_file, rate, seed = sys.argv
        reader_process(bootstrap, namespace, int(readers), stop_file, log_file, float(rate), int(seed))
