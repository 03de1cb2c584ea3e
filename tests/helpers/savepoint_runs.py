"""Readers that roll back to savepoints (SAVE TRANSACTION / ROLLBACK TRANSACTION name), for
tests/integration/test_savepoints.py:

- `savepoint_reader_process` (`python -m tests.helpers.savepoint_runs reader ...`): the invariant
  run's reader (tests/helpers/invariants.py) with savepoints. Each transaction RECEIVEs TOP(2),
  then up to three times saves a savepoint (the same name each time), RECEIVEs more of the same
  group and, at random, SENDs a decoy reply listing everything it holds and rolls back to the
  savepoint (which must give the later messages back, in order, and drop the decoy: a decoy
  that survived would count its messages twice); then it SENDs the one reply listing what it
  holds and commits, or rolls back whole. The checker reads the committed replies back from
  Kafka, as for the plain run.
- `watch_process` (`python -m tests.helpers.savepoint_runs watch ...`): another process that
  RECEIVEs from a queue in a loop, logging each pass and each message it got.
- `PoisonReader`: Service Broker's poison-message pattern, with a SQLite table of failures per
  conversation as the application's own state.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers.invariants import REPLY


def savepoint_reader_process(
    bootstrap: str,
    namespace: str,
    readers: int,
    stop_file: str,
    log_file: str,
    rollback_rate: float,
    partial_rate: float,
    seed: int,
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
                held = tx.receive("RequestQueue", top=2, wait=0.5)
                if not held:
                    tx.rollback()
                    continue
                leased = time.time()
                group, handle = held[0].conversation_group_id, held[0].conversation_handle
                partial = reordered = 0
                for _ in range(rng.randint(0, 3)):
                    tx.savepoint("more")
                    more = tx.receive("RequestQueue", top=rng.randint(1, 2), wait=0, conversation_group=group)
                    if rng.random() >= partial_rate:
                        held += more
                        continue
                    tx.send(handle, REPLY, reply_body(held + more, leased, idx, decoy=True))
                    if rng.random() < 0.5:
                        tx.savepoint("inner")
                        tx.send(handle, REPLY, reply_body(held + more, leased, idx, decoy=True))
                    tx.rollback_to("more")
                    partial += 1
                    again = tx.receive("RequestQueue", top=len(more) or 1, wait=0, conversation_group=group)
                    # What came after the savepoint comes again first, in order (the lock was kept).
                    if [m.message_id for m in again[: len(more)]] != [m.message_id for m in more]:
                        reordered += 1
                    held += again
                time.sleep(rng.uniform(0, 0.01))
                body = reply_body(held, leased, idx)
                tx.send(handle, REPLY, body)
                if rng.random() < rollback_rate:
                    tx.rollback()
                    continue
                body["committing"] = time.time()
                tx.commit()
                with lock:
                    log.write(
                        json.dumps({**body, "committed": tx.committed_at, "partial": partial, "reordered": reordered})
                        + "\n"
                    )
            except TransactionAbortedError:
                pass  # a rebalance moved the partition: the new owner receives these again
            except QueueDisabledError:
                tx.rollback()
                time.sleep(0.2)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    broker.close()


def reply_body(msgs: list[Any], leased: float, reader: int, decoy: bool = False) -> dict[str, Any]:
    """The reply listing what a transaction holds (tests/helpers/invariants.check's form)."""
    return {
        "pid": os.getpid(),
        "reader": reader,
        "leased": leased,
        "conversation_id": msgs[0].conversation_id,
        "group": msgs[0].conversation_group_id,
        "seqs": [m.message_sequence_number for m in msgs],
        "ids": [m.message_id for m in msgs],
        **({"decoy": True} if decoy else {}),
    }


def watch_process(bootstrap: str, namespace: str, queue: str, stop_file: str, log_file: str) -> None:
    """RECEIVE from `queue` until `stop_file` exists: a line once its consumer was made (it joins
    the queue's group then), then one per RECEIVE with what it got. A RECEIVE in a process that
    owns none of the queue's partitions returns empty only after 30 s (it cannot tell an empty
    queue from one it has not read yet), so a pass that got nothing is slow; one that got
    something returns at once."""
    from kbroker.sdk.broker import Broker

    broker = Broker(bootstrap, namespace)
    broker.runtime.receiver(queue)
    with open(log_file, "a", buffering=1) as log:
        log.write(json.dumps({"joined": time.time(), "ids": []}) + "\n")
        while not os.path.exists(stop_file):
            got = broker.receive(queue, top=100, wait=0.2)
            log.write(json.dumps({"pass": time.time(), "ids": [m.message_id for m in got]}) + "\n")
    broker.close()


class Poison(Exception):
    """The processing of a message failed (its body says so)."""


class PoisonReader:
    """Service Broker's poison-message pattern, in one transaction per message:

        SAVE TRANSACTION undo_receive; RECEIVE TOP(1); SAVE TRANSACTION received;
        process (SEND the reply); on failure:
            count the failure of the conversation in the application's own table;
            under `threshold` failures: ROLLBACK TRANSACTION undo_receive (the message goes back
                to the queue, the group still locked until the commit);
            at `threshold`: ROLLBACK TRANSACTION received (the reply is undone, the message stays
                received) and END CONVERSATION WITH ERROR;
        COMMIT.

    No transaction rolls back whole, so the queue's poison detection never counts one (a
    partial rollback is not a rollback of the transaction): the poison message never disables
    the queue. `db`: the SQLite file of the failure counts."""

    def __init__(self, broker: Any, queue: str, db: Path, threshold: int):
        self.broker, self.queue, self.db, self.threshold = broker, queue, db, threshold
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS failures (conversation TEXT PRIMARY KEY, count INTEGER)")
        self.received: list[tuple[str, int]] = []  # (conversation, sequence) of each message handed out
        self.ended: list[str] = []
        self._lock = threading.Lock()

    def failures(self, conversation: str) -> int:
        with sqlite3.connect(self.db) as conn:
            row = conn.execute("SELECT count FROM failures WHERE conversation = ?", (conversation,)).fetchone()
        return 0 if row is None else int(row[0])

    def _failed(self, conversation: str) -> int:
        with self._lock, sqlite3.connect(self.db) as conn:
            conn.execute(
                "INSERT INTO failures VALUES (?, 1) ON CONFLICT(conversation) DO UPDATE SET count = count + 1",
                (conversation,),
            )
            return int(conn.execute("SELECT count FROM failures WHERE conversation = ?", (conversation,)).fetchone()[0])

    def once(self, wait: float = 1.0) -> bool:
        """One transaction; False when its RECEIVE found nothing."""
        import orjson

        tx = self.broker.transaction()
        tx.savepoint("undo_receive")
        msgs = tx.receive(self.queue, top=1, wait=wait)
        if not msgs:
            tx.rollback()  # nothing received: counts for nothing either
            return False
        m = msgs[0]
        with self._lock:
            self.received.append((m.conversation_id, m.message_sequence_number))
        tx.savepoint("received")
        try:
            body = orjson.loads(m.body)
            tx.send(m.conversation_handle, REPLY, {"seq": m.message_sequence_number, "id": m.message_id})
            if body.get("poison"):
                raise Poison(m.message_id)
        except Poison:
            if self._failed(m.conversation_id) >= self.threshold:
                tx.rollback_to("received")
                tx.end_conversation(m.conversation_handle, error=50001, description="poison message")
                with self._lock:
                    self.ended.append(m.conversation_id)
            else:
                tx.rollback_to("undo_receive")
        tx.commit()
        return True


if __name__ == "__main__":
    if sys.argv[1] == "reader":
        _, _, bootstrap, namespace, readers, stop_file, log_file, rate, partial_rate, seed = sys.argv
        savepoint_reader_process(
            bootstrap, namespace, int(readers), stop_file, log_file, float(rate), float(partial_rate), int(seed)
        )
    elif sys.argv[1] == "watch":
        _, _, bootstrap, namespace, queue, stop_file, log_file = sys.argv
        watch_process(bootstrap, namespace, queue, stop_file, log_file)
