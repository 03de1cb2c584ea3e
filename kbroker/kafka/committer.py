"""Group commit: many readers' transactions share one Kafka transactional producer per process.

A reader's commit hands its held SENDs and its leases (consumed offsets) to the committer and
waits. The committer takes whatever is waiting and, while other transactions of the process are
still open (they may commit soon), waits up to `interval` for more; then it commits them all in
one Kafka transaction: the records, then the consumed offsets of every queue
(send_offsets_to_transaction, which also fences a zombie that lost its partitions), then
commit. Every reader in the batch learns the same outcome.

Kafka transactions run one at a time, in submission order, but on a small ring of transactional
producers: right after a commit the coordinator is still writing that transaction's markers and
answers the same producer's next transaction with CONCURRENT_TRANSACTIONS until it is done,
while another producer can start at once. Order is unchanged: each transaction has committed
before the next one begins, so their records reach the log in commit order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import KafkaException, Producer

from kbroker.core.records import Record
from kbroker.errors import TransactionAbortedError
from kbroker.kafka import clients
from kbroker.kafka.clients import produce
from kbroker.kafka.receiver import Lease

log = logging.getLogger("kbroker.committer")


@dataclass(eq=False)
class CommitRequest:
    """One transaction's commit: its records to produce and its leases' offsets to commit."""

    records: list[Record]
    leases: list[Lease]
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    committed_at: float = 0.0

    def finish(self, error: Exception | None) -> None:
        """Tell the waiting transaction the outcome (None: committed)."""
        self.error, self.committed_at = error, time.time()
        self.done.set()


class OpenTransactions:
    """How many transactions of the process are open and have not asked to commit yet: the
    committer waits for more only while one of them might still join its batch."""

    def __init__(self) -> None:
        self._n, self._lock = 0, threading.Lock()

    def opened(self) -> None:
        """A transaction began."""
        with self._lock:
            self._n += 1

    def closed(self) -> None:
        """A transaction asked to commit, or ended without committing."""
        with self._lock:
            self._n -= 1

    def __call__(self) -> int:
        return self._n


class GroupCommitter:
    """Commits the process's transactions in batches, one Kafka transaction per batch. Built
    without I/O; start() creates the transactional producers (with `new_producer`, given their
    settings) and the committing thread."""

    def __init__(self, bootstrap: str, namespace: str, *, interval: float = 0.005,
                 max_batch: int = 1000, timeout: float = 30.0, producers: int = 2,
                 open_transactions: Callable[[], int] = lambda: 1,
                 new_producer: Callable[[dict[str, Any]], Producer] = Producer):
        self._namespace, self._make_producer = namespace, new_producer
        self._conf: dict[str, Any] = clients.base(bootstrap, **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 1,
            "message.max.bytes": 11 * 1024 * 1024,
            # Right after a commit the coordinator is still writing markers and answers the next
            # transaction's first request with CONCURRENT_TRANSACTIONS; the retry back-off then
            # dominates every commit. Measured on the embedded broker, a transaction of one
            # offset commit takes 114 ms at the default 100 ms, 9.4 ms at 5/50 ms and 4.6 ms at 1/5 ms.
            "retry.backoff.ms": 1, "retry.backoff.max.ms": 5,
            # A process killed mid-commit leaves its Kafka transaction open; readers of those
            # partitions wait at the last stable offset until Kafka aborts it after this long.
            "transaction.timeout.ms": 10_000,
        })
        self._interval, self._max_batch, self._timeout = interval, max_batch, timeout
        self._open_transactions = open_transactions
        self._producers = max(1, producers)
        self._ring: list[Producer] = []
        self._turn = 0  # the ring's producer for the next Kafka transaction
        self._queue: queue.Queue[CommitRequest | None] = queue.Queue()
        self._busy = threading.Lock()  # held while a Kafka transaction is under way
        self._closed = False
        self.batches = 0
        self._thread: threading.Thread | None = None

    def start(self) -> "GroupCommitter":
        """Create the producer ring (init_transactions, a broker round trip each) and start the
        committing thread; returns self."""
        self._ring = [self._new_producer() for _ in range(self._producers)]
        self._thread = threading.Thread(target=self._run, name="kbroker-committer", daemon=True)
        self._thread.start()
        return self

    def _new_producer(self) -> Producer:
        p = self._make_producer({**self._conf,
                                 "transactional.id": f"kbroker.{self._namespace}.{uuid.uuid4()}"})
        p.init_transactions(self._timeout)
        return p

    def submit(self, request: CommitRequest) -> CommitRequest:
        """Queue a commit without waiting; its `done` event is set once it has an outcome."""
        if self._thread is None and not self._closed:
            raise RuntimeError("GroupCommitter.start() was not called")
        if self._closed:
            request.finish(TransactionAbortedError("the broker connection is closed"))
        else:
            self._queue.put(request)
        return request

    def commit(self, request: CommitRequest) -> None:
        """Submit and wait for the outcome; raises TransactionAbortedError when it did not commit."""
        self.submit(request).done.wait()
        if request.error is not None:
            raise request.error

    def barrier(self) -> None:
        """Return once no Kafka transaction is under way (used when partitions are revoked)."""
        with self._busy:
            pass

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self._interval
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    # Waiting for more pays only if some open transaction may still commit; a
                    # lone reader would otherwise add `interval` to every commit.
                    left = deadline - time.monotonic()
                    if left <= 0 or self._open_transactions() <= 0:
                        break
                    try:
                        nxt = self._queue.get(timeout=min(left, 0.001))
                    except queue.Empty:
                        continue
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            with self._busy:
                self._commit(batch)

    def _commit(self, batch: list[CommitRequest]) -> None:
        # Offsets are grouped per queue consumer: each has its own group metadata.
        by_receiver: dict[Any, list[Lease]] = {}
        for req in batch:
            for lease in req.leases:
                by_receiver.setdefault(lease.receiver, []).append(lease)
        positions = {}
        for receiver, leases in by_receiver.items():
            tps = receiver.include(leases)
            if tps is None:  # a rebalance doomed one of them: fail the whole batch, retry the rest
                for r, ls in by_receiver.items():
                    if r in positions:
                        r.exclude(ls)
                return self._split_doomed(batch)
            positions[receiver] = tps
        producer = self._ring[self._turn]
        self._turn = (self._turn + 1) % len(self._ring)
        try:
            producer.begin_transaction()
            for req in batch:
                for topic, key, value, headers in req.records:
                    produce(producer, topic, key=key, value=value, headers=headers)
            for receiver, tps in positions.items():
                producer.send_offsets_to_transaction(tps, receiver.group_metadata(), self._timeout)
            producer.commit_transaction(self._timeout)
        except KafkaException as exc:
            for receiver, leases in by_receiver.items():
                receiver.exclude(leases)
            self._recover(producer, exc)
            for req in batch:
                req.finish(TransactionAbortedError(f"the Kafka transaction failed: {exc.args[0].str()}"))
            return
        self.batches += 1
        for req in batch:
            req.finish(None)

    def _split_doomed(self, batch: list[CommitRequest]) -> None:
        doomed = [r for r in batch if any(l.doomed for l in r.leases)]
        for req in doomed:
            req.finish(TransactionAbortedError("the queue's partition moved to another process (rebalance)"))
        rest = [r for r in batch if r not in doomed]
        if rest:
            self._commit(rest)

    def _recover(self, producer: Producer, exc: KafkaException) -> None:
        err = exc.args[0]
        try:
            if err.fatal():
                log.error("transactional producer fenced or failed fatally (%s); starting a new one", err)
                self._replace(producer)
            else:
                producer.abort_transaction(self._timeout)
        except KafkaException as again:
            log.error("abort failed (%s); starting a new transactional producer", again)
            self._replace(producer)

    def _replace(self, producer: Producer) -> None:
        self._ring[self._ring.index(producer)] = self._new_producer()

    def close(self) -> None:
        """Commit what is queued, stop the thread, and fail whatever arrives after."""
        self._closed = True
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=self._timeout)
        while not self._queue.empty():  # anything that raced in after the sentinel
            req = self._queue.get_nowait()
            if req is not None:
                req.finish(TransactionAbortedError("the broker connection is closed"))
