"""Group commit: many readers' transactions share one Kafka transactional producer per process.

A reader's commit hands its held SENDs and its leases (consumed offsets) to the committer and
waits. The committer takes whatever is waiting and, while other transactions of the process are
still active (they may commit soon), waits up to `interval` for more; then it commits them all in
one Kafka transaction: the records, then the consumed offsets of every queue
(send_offsets_to_transaction, which also fences a zombie that lost its partitions), then
commit. Every reader in the batch learns the same outcome, but one: a record Kafka refuses for
itself (too large for its topic) fails only the request that holds it (RecordRefusedError), and
the others are committed at once without it; a batch is one transaction to save round trips,
not because its requests belong together.

The committer is three jobs, one module each: this batch loop, which gathers requests
(commit_requests.py: what a transaction hands over, and who waits for the outcome) and commits
them; the ring of transactional producers its Kafka transactions take turns on
(producer_ring.py: creating, replacing and fencing them); and the settling of a transaction that
failed (settling.py: whether it committed, and closing an open transaction it left).

No call waits for ever: every librdkafka call of a transaction runs on its producer's own thread
(kafka/txn/guarded.py) and the committer stops waiting at the transaction's deadline. A stuck or
fenced producer is abandoned and replaced by a new one with the same transactional.id, and the
batch fails with the retriable TransactionAbortedError (kbroker/core/txn/faults.py says when
that is safe and how an in-doubt commit is settled first).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kbroker import metrics
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.txn.commit_holder import holder_of, with_holder
from kbroker.core.txn.faults import Deadline, Stage
from kbroker.core.txn.transaction_log import OPEN_TRANSACTION_AFTER
from kbroker.errors import (
    RebalanceAbortedError,
    RecordRefusedError,
    TransactionAbortedError,
    TransactionInDoubtError,
    denied_code,
)
from kbroker.kafka import clients
from kbroker.kafka.txn.close_open import OpenTransaction
from kbroker.kafka.txn.commit_requests import CommitRequest, Lease, refused_requests
from kbroker.kafka.txn.guarded import CallDeadlineExceeded, TransactionFailed, transact
from kbroker.kafka.txn.offset_commit import OffsetCommits
from kbroker.kafka.txn.producer_ring import ProducerRing, Slot
from kbroker.kafka.txn.settling import GROUP_FENCES, Positions, Settler

log = logging.getLogger("kbroker.committer")


class ActiveTransactions:
    """How many kbroker transactions (sdk) of the process are active, begun and not yet asked to
    commit: the committer waits for more only while one of them might still join its batch."""

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

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        *,
        interval: float = 0.005,
        max_batch: int = 1000,
        timeout: float = 30.0,
        producers: int = 2,
        transaction_deadline: float = 10.0,
        resolve_timeout: float = 120.0,
        open_transaction_after: float = OPEN_TRANSACTION_AFTER,
        active_transactions: Callable[[], int] = lambda: 1,
        new_producer: Callable[[dict[str, Any]], Producer] = Producer,
        transactional_ids: tuple[str, ...] = (),
    ):
        self._namespace = namespace
        self._cluster = Cluster.of(cluster)
        self._interval, self._max_batch, self._timeout = interval, max_batch, timeout
        # Kafka aborts a transaction open longer than transaction.timeout.ms anyway, so a
        # transaction that has not committed by then is given up (and its producer if stuck).
        self._transaction_deadline = transaction_deadline
        self._active_transactions = active_transactions
        self._ring = ProducerRing(
            cluster,
            namespace,
            producers=producers,
            transactional_ids=transactional_ids,
            new_producer=new_producer,
            timeout=timeout,
            transaction_deadline=transaction_deadline,
            group_metadata=lambda group: self._settler.group_metadata(group),
            closed=lambda: self._closed,
        )
        self._settler = Settler(
            self._cluster,
            namespace,
            self._ring,
            timeout=timeout,
            transaction_deadline=transaction_deadline,
            resolve_timeout=resolve_timeout,
            open_transaction_after=open_transaction_after,
            closed=lambda: self._closed,
        )
        self._offsets = OffsetCommits(
            transaction_deadline,
            lambda err, offsets: clients.denied(
                self._cluster, err, "committing a queue's offsets", group=("READ", offsets[0].topic)
            ),
        )
        self.holder = holder_of(self.transactional_ids, namespace)  # what its offsets' metadata names
        self._queue: queue.Queue[CommitRequest | None] = queue.Queue()
        self._busy = threading.Lock()  # held while a Kafka transaction is under way
        self._closed = False
        self.batches = 0
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """Whether close() has begun: a request submitted now fails at once."""
        return self._closed

    @property
    def transactional_ids(self) -> tuple[str, ...]:
        """The ring's transactional ids: fencing them stops this committer's open transactions."""
        return self._ring.transactional_ids

    @property
    def direct_commits(self) -> int:
        """Batches that wrote nothing, committed with a queue consumer's offset commit."""
        return self._offsets.commits

    @property
    def generation(self) -> int:
        """Producers created so far (producer_ring.py): a transaction that took a conversation
        lease records it, and commits only on producers at least as old."""
        return self._ring.generation

    def start(self) -> GroupCommitter:
        """Create the producer ring (init_transactions, a broker round trip each) and start the
        committing thread; returns self."""
        for slot in self._ring.slots:
            try:
                self._ring.ready(slot, self._timeout)
            except CallDeadlineExceeded as exc:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, str(exc))) from None
            except KafkaException as exc:
                if not denied_code(exc.args[0]):
                    raise
                self.close()
                raise clients.denied(
                    self._cluster,
                    exc.args[0],
                    "starting a transactional producer",
                    transactional_id=("WRITE", slot.transactional_id),
                ) from None
        self._thread = threading.Thread(target=self._run, name="kbroker-committer", daemon=True)
        self._thread.start()
        return self

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

    def barrier(self, serve: Callable[[], None] = lambda: None) -> None:
        """Return once no Kafka transaction is under way (used when partitions are revoked),
        running `serve` every 5 ms meanwhile: the offset commits handed to the waiting poll
        thread (kafka/receive/poll_commits.py), which the batch under way may wait for."""
        while not self._busy.acquire(timeout=0.005):
            serve()
        self._busy.release()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.5)
            except queue.Empty:
                self._ring.restock()
                continue
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self._interval
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    # Waiting for more pays only if some active transaction may still commit; a
                    # lone reader would otherwise add `interval` to every commit.
                    left = deadline - time.monotonic()
                    if left <= 0 or self._active_transactions() <= 0:
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
                try:
                    self._commit(batch)
                except Exception as exc:  # noqa: BLE001 - the committing thread outlives any batch
                    self._failed_unexpectedly(batch, exc)

    def _failed_unexpectedly(self, batch: list[CommitRequest], exc: Exception) -> None:
        """An error no stage of the transaction expected: confluent-kafka once raised SystemError,
        not KafkaException, from a fenced producer's flush, and that ended this thread, so every
        commit after it waited for ever. Nobody waits on the batch for ever now: its outcome is
        unknown (in doubt), and every producer of the ring is replaced, which fences whatever
        open transaction the failed one left."""
        log.error("a group commit failed unexpectedly (%r); replacing the transactional producers", exc)
        self._ring.abandon_all()
        for req in batch:
            if not req.done.is_set():
                req.finish(TransactionInDoubtError(f"the commit failed unexpectedly: {exc!r}"))

    def _commit(self, batch: list[CommitRequest]) -> None:
        batch = self._without_outdated(batch)
        if not batch:
            return
        # Offsets are grouped per queue consumer: each has its own group metadata.
        by_receiver: dict[Any, list[Lease]] = {}
        for req in batch:
            for lease in req.leases:
                by_receiver.setdefault(lease.receiver, []).append(lease)
        held_up = self._offsets.settled(list(by_receiver))  # a direct commit still in doubt
        if held_up is not None:
            for req in batch:
                req.finish(held_up)
            return
        positions: Positions = {}
        for receiver, leases in by_receiver.items():
            tps = receiver.include(leases)
            if tps is None:  # a rebalance doomed one of them: fail the whole batch, retry the rest
                for r, ls in by_receiver.items():
                    if r in positions:
                        r.exclude(ls)
                return self._split_doomed(batch)
            # Each offset names this process, so a next owner finding the partition held by an
            # open transaction of this one can fence it (core/txn/commit_holder.py).
            positions[receiver] = [
                TopicPartition(tp.topic, tp.partition, tp.offset, metadata=with_holder(tp.metadata or "", self.holder))
                for tp in tps
            ]
        metrics.of(metrics.GROUP_COMMIT_SIZE, self._namespace).observe(len(batch))
        started = time.monotonic()
        if self._offsets.took(batch, by_receiver, positions):  # wrote nothing: no Kafka transaction
            metrics.of(metrics.OFFSET_COMMIT_SECONDS, self._namespace).observe(time.monotonic() - started)
            self.batches += 1
            return
        slot = self._ring.take_turn()
        deadline, began = Deadline(self._transaction_deadline), time.time()
        try:
            self._transact(slot, batch, positions, deadline)
        except TransactionFailed as failed:
            topics = frozenset(rec[0] for req in batch for rec in req.records)
            committed = self._settler.settle(
                slot, failed, deadline, positions, OpenTransaction.of(topics, positions, began)
            )
            if committed is not True:
                for receiver, leases in by_receiver.items():
                    receiver.exclude(leases)
                refused = refused_requests(batch, failed.refused) if committed is False else {}
                if refused:
                    # The batch is one Kafka transaction only to save round trips: a record Kafka
                    # refuses for itself fails its own request, and the others commit without it.
                    for req, why in refused.items():
                        req.finish(RecordRefusedError(why))
                    rest = [r for r in batch if r not in refused]
                    if rest:
                        self._commit(rest)
                    return
                error: Exception = (
                    TransactionAbortedError(f"the Kafka transaction failed: {failed.reason}")
                    if committed is False
                    else TransactionInDoubtError(failed.reason)
                )
                if committed is False and failed.error is not None and failed.error.code() in GROUP_FENCES:
                    error = RebalanceAbortedError(f"the queue's group rebalanced during the commit: {failed.reason}")
                if failed.error is not None and denied_code(failed.error):
                    # Refused by the authorizer: it would be refused again, so not retriable.
                    error = self._refusal(failed.error, slot, batch, positions)
                for req in batch:
                    req.finish(error)
                return
        self.batches += 1
        for req in batch:
            req.finish(None)

    def _refusal(self, err: KafkaError, slot: Slot, batch: list[CommitRequest], positions: Positions) -> Exception:
        """The authorizer's refusal of a transaction, naming what it may have refused: the
        transactional id, the topics its records go to, or the queue groups it commits for."""
        topics = sorted(
            {rec[0] for req in batch for rec in req.records} | {tp.topic for tps in positions.values() for tp in tps}
        )
        groups = sorted({tps[0].topic for tps in positions.values() if tps})  # a queue's group is named as its topic
        return clients.denied(
            self._cluster,
            err,
            "committing a Kafka transaction",
            transactional_id=("WRITE", slot.transactional_id),
            topic=("WRITE", " or ".join(topics)),
            group=("READ", " or ".join(groups)),
        )

    def _transact(self, slot: Slot, batch: list[CommitRequest], positions: Positions, deadline: Deadline) -> None:
        """One Kafka transaction for `batch` on `slot`'s producer, within `deadline`."""
        try:
            producer = self._ring.ready(slot, deadline.call_timeout(self._timeout))
        except (KafkaException, CallDeadlineExceeded) as exc:
            raise TransactionFailed.at(Stage.INIT, exc) from exc
        started = time.monotonic()
        try:
            transact(
                producer,
                [rec for req in batch for rec in req.records],
                [(tps, receiver.group_metadata()) for receiver, tps in positions.items() if tps],
                deadline,
                self._timeout,
            )
        finally:
            metrics.of(metrics.KAFKA_TRANSACTION_SECONDS, self._namespace).observe(time.monotonic() - started)

    def _without_outdated(self, batch: list[CommitRequest]) -> list[CommitRequest]:
        """Fail the requests whose conversation leases were checked before the producer that
        would commit them was created (the slot's producer is made ready first, so the
        generation is the one the Kafka transaction will run on)."""
        try:
            self._ring.ready(self._ring.current, self._timeout)
        except (KafkaException, CallDeadlineExceeded):
            pass  # the transaction meets it again and fails as any other
        outdated = [r for r in batch if r.generation is not None and r.generation < self.generation]
        for req in outdated:
            req.finish(
                TransactionAbortedError(
                    "a transactional producer was replaced while this transaction held conversation leases; "
                    "another process may have taken one over"
                )
            )
        return [r for r in batch if r not in outdated] if outdated else batch

    def _split_doomed(self, batch: list[CommitRequest]) -> None:
        doomed = [r for r in batch if any(lease.doomed for lease in r.leases)]
        for req in doomed:
            req.finish(RebalanceAbortedError("the queue's partition moved to another process (rebalance)"))
        rest = [r for r in batch if r not in doomed]
        if rest:
            self._commit(rest)

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
        self._settler.close()
        self._ring.abandon_all()  # their threads end, and librdkafka's producers with them
