"""Group commit: many readers' transactions share one Kafka transactional producer per process.

A reader's commit hands its held SENDs and its leases (consumed offsets) to the committer and
waits. The committer takes whatever is waiting and, while other transactions of the process are
still open (they may commit soon), waits up to `interval` for more; then it commits them all in
one Kafka transaction: the records, then the consumed offsets of every queue
(send_offsets_to_transaction, which also fences a zombie that lost its partitions), then
commit. Every reader in the batch learns the same outcome, but one: a record Kafka refuses for
itself (too large for its topic) fails only the request that holds it (RecordRefusedError), and
the others are committed at once without it; a batch is one transaction to save round trips,
not because its requests belong together.

Kafka transactions run one at a time, in submission order, but on a small ring of transactional
producers: right after a commit the coordinator is still writing that transaction's markers and
answers the same producer's next transaction with CONCURRENT_TRANSACTIONS until it is done,
while another producer can start at once. Order is unchanged: each transaction has committed
before the next one begins, so their records reach the log in commit order.

No call waits for ever: every librdkafka call of a transaction runs on its producer's own thread
(kafka/txn/guarded.py) and the committer stops waiting at the transaction's deadline. A stuck or
fenced producer is abandoned and replaced by a new one with the same transactional.id, and the
batch fails with the retriable TransactionAbortedError (kbroker/core/txn/faults.py says when
that is safe and how an in-doubt commit is settled first).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Callable, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kbroker import metrics
from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.txn.commit_holder import holder_of, transactional_id, with_holder
from kbroker.core.records import Record
from kbroker.core.txn.faults import Action, Deadline, Position, Stage, committed_by_offsets, decide
from kbroker.core.txn.transaction_log import LEFT_OPEN_AFTER, LeftOpen, outcome_before_init
from kbroker.errors import (
    KBrokerError,
    RebalanceAbortedError,
    RecordRefusedError,
    TransactionAbortedError,
    TransactionInDoubtError,
    denied_code,
)
from kbroker.kafka import clients
from kbroker.kafka.txn.guarded import (
    CallDeadlineExceeded,
    GuardedProducer,
    TransactionFailed,
    started,
    reason,
    transact,
)
from kbroker.kafka.txn.left_open import Unclosed, close_aborted, close_committed
from kbroker.kafka.reader import group_offsets, offsets_reader, without_errors
from kbroker.kafka.txn.transaction_log import transaction_history

log = logging.getLogger("kbroker.committer")

# What a read of committed offsets, or a producer's init, fails with while the broker cannot answer.
UNREADABLE = (KafkaException, CallDeadlineExceeded, concurrent.futures.TimeoutError)

# The transaction log is read from this long before an in-doubt transaction began (clocks differ).
LOG_MARGIN = 60.0

# What send_offsets_to_transaction meets when the queue's group moved on to a new generation
# since the offsets' group metadata was taken (a reader joined or left): a fence, not a fault.
GROUP_FENCES = frozenset(getattr(KafkaError, name) for name in (
    "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS", "FENCED_INSTANCE_ID",
    "FENCED_MEMBER_EPOCH", "STALE_MEMBER_EPOCH") if hasattr(KafkaError, name))


@dataclass(eq=False)
class _Slot:
    """A place in the producer ring: a transactional.id kept for good, and the producer that
    currently has it (None until created, and after it was abandoned)."""

    transactional_id: str
    producer: GuardedProducer | None = None
    # A failed transaction of this id whose markers may be missing: the next producer closes it
    # (as aborted) before its first transaction (kafka/txn/left_open.py).
    unclosed: Unclosed | None = None


class Lease(Protocol):
    """What the committer needs of a receive lease (kafka/receive/receive_leases.Lease): the
    receiver whose offsets it completes, and whether a rebalance doomed it."""

    receiver: Any
    doomed: bool


@dataclass(eq=False)
class CommitRequest:
    """One transaction's commit: its records to produce and its leases' offsets to commit."""

    records: list[Record]
    leases: Sequence[Lease]
    # The committer's generation when the transaction first took a conversation lease (None:
    # it took none). A producer created since may postdate a fence meant for this process.
    generation: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    committed_at: float = 0.0
    # Called with the request once it has its outcome, on the committer's thread: it must not
    # wait (it may submit another request).
    then: Callable[["CommitRequest"], None] | None = None

    def finish(self, error: Exception | None) -> None:
        """Tell the waiting transaction the outcome (None: committed)."""
        self.error, self.committed_at = error, time.time()
        self.done.set()
        if self.then is not None:
            try:
                self.then(self)
            except Exception:  # noqa: BLE001 - the committer's thread must go on committing
                log.exception("a commit request's follow-up failed")


def refused_requests(batch: list[CommitRequest], refused: dict[int, str]) -> dict[CommitRequest, str]:
    """The requests of `batch` that hold a record Kafka refused (`refused`: index of the record
    in the batch's records, as the transaction produced them, -> why), with the first why."""
    out: dict[CommitRequest, str] = {}
    start = 0
    for req in batch:
        end = start + len(req.records)
        why = next((refused[i] for i in range(start, end) if i in refused), None)
        if why is not None:
            out[req] = why
        start = end
    return out


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

    def __init__(self, cluster: ClusterLike, namespace: str, *, interval: float = 0.005,
                 max_batch: int = 1000, timeout: float = 30.0, producers: int = 2,
                 transaction_deadline: float = 10.0, resolve_timeout: float = 120.0,
                 left_open_after: float = LEFT_OPEN_AFTER,
                 open_transactions: Callable[[], int] = lambda: 1,
                 new_producer: Callable[[dict[str, Any]], Producer] = Producer,
                 transactional_ids: tuple[str, ...] = ()):
        self._namespace, self._make_producer = namespace, new_producer
        self._cluster = Cluster.of(cluster)
        self._conf: dict[str, Any] = clients.base(cluster, **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 1,
            "message.max.bytes": clients.MAX_MESSAGE_BYTES,
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
        # Kafka aborts a transaction open longer than transaction.timeout.ms anyway, so a
        # transaction that has not committed by then is given up (and its producer if stuck).
        self._transaction_deadline = transaction_deadline
        self._resolve_timeout = resolve_timeout  # how long an in-doubt commit may take to settle
        self._left_open_after = left_open_after  # unreadable offsets for this long: ask the transaction log
        # Per queue group: a consumer that reads its committed offsets, to settle an in-doubt commit.
        self._offsets_readers: dict[str, Consumer] = {}
        self._open_transactions = open_transactions
        # transactional_ids: the ring's ids chosen by the caller (who names them before the start).
        self._ring = [_Slot(tid) for tid in transactional_ids] or \
            [_Slot(transactional_id(namespace, uuid.uuid4())) for _ in range(max(1, producers))]
        self.holder = holder_of(self.transactional_ids, namespace)  # what its offsets' metadata names
        self._turn = 0  # the ring's producer for the next Kafka transaction
        self._queue: queue.Queue[CommitRequest | None] = queue.Queue()
        self._busy = threading.Lock()  # held while a Kafka transaction is under way
        self._closed = False
        self.batches = 0
        # Producers created so far. A transaction that took a conversation lease commits only on
        # producers at least as old as its lease check: if the lease ran out and another process
        # fenced this one's transactional ids, those producers are fenced too, whereas a
        # replacement created after the fence would commit (core/dialogs/send_lease.py).
        self.generation = 0
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """Whether close() has begun: a request submitted now fails at once."""
        return self._closed

    @property
    def transactional_ids(self) -> tuple[str, ...]:
        """The ring's transactional ids: fencing them stops this committer's open transactions."""
        return tuple(slot.transactional_id for slot in self._ring)

    def start(self) -> "GroupCommitter":
        """Create the producer ring (init_transactions, a broker round trip each) and start the
        committing thread; returns self."""
        for slot in self._ring:
            try:
                self._ready(slot, self._timeout)
            except CallDeadlineExceeded as exc:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, str(exc))) from None
            except KafkaException as exc:
                if not denied_code(exc.args[0]):
                    raise
                self.close()
                raise clients.denied(self._cluster, exc.args[0], "starting a transactional producer",
                                     transactional_id=("WRITE", slot.transactional_id)) from None
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

    def barrier(self) -> None:
        """Return once no Kafka transaction is under way (used when partitions are revoked)."""
        with self._busy:
            pass

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.5)
            except queue.Empty:
                self._restock()
                continue
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
                try:
                    self._commit(batch)
                except Exception as exc:  # noqa: BLE001 - the committing thread outlives any batch
                    self._failed_unexpectedly(batch, exc)

    def _failed_unexpectedly(self, batch: list[CommitRequest], exc: Exception) -> None:
        """An error no stage of the transaction expected: confluent-kafka once raised SystemError,
        not KafkaException, from a fenced producer's flush, and that ended this thread, so every
        commit after it waited for ever. Nobody waits on the batch for ever now: its outcome is
        unknown (in doubt), and every producer of the ring is replaced, which fences whatever
        the failed one left open."""
        log.error("a group commit failed unexpectedly (%r); replacing the transactional producers", exc)
        for slot in self._ring:
            self._abandon(slot)
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
        positions = {}
        for receiver, leases in by_receiver.items():
            tps = receiver.include(leases)
            if tps is None:  # a rebalance doomed one of them: fail the whole batch, retry the rest
                for r, ls in by_receiver.items():
                    if r in positions:
                        r.exclude(ls)
                return self._split_doomed(batch)
            # Each offset names this process, so a next owner finding the partition held by a
            # transaction left open here can fence it (core/txn/commit_holder.py).
            positions[receiver] = [TopicPartition(tp.topic, tp.partition, tp.offset,
                                                  metadata=with_holder(tp.metadata or "", self.holder))
                                   for tp in tps]
        slot = self._ring[self._turn]
        self._turn = (self._turn + 1) % len(self._ring)
        deadline, began = Deadline(self._transaction_deadline), time.time()
        metrics.of(metrics.GROUP_COMMIT_SIZE, self._namespace).observe(len(batch))
        try:
            self._transact(slot, batch, positions, deadline)
        except TransactionFailed as failed:
            topics = frozenset(rec[0] for req in batch for rec in req.records)
            committed = self._settle(slot, failed, deadline, positions, Unclosed.of(topics, positions, began))
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
                error: Exception = (TransactionAbortedError(f"the Kafka transaction failed: {failed.reason}")
                                    if committed is False else TransactionInDoubtError(failed.reason))
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

    def _refusal(self, err: KafkaError, slot: "_Slot", batch: list[CommitRequest],
                 positions: dict[Any, list[TopicPartition]]) -> Exception:
        """The authorizer's refusal of a transaction, naming what it may have refused: the
        transactional id, the topics its records go to, or the queue groups it commits for."""
        topics = sorted({rec[0] for req in batch for rec in req.records} |
                        {tp.topic for tps in positions.values() for tp in tps})
        groups = sorted({tps[0].topic for tps in positions.values() if tps})  # a queue's group is named as its topic
        return clients.denied(self._cluster, err, "committing a Kafka transaction",
                              transactional_id=("WRITE", slot.transactional_id),
                              topic=("WRITE", " or ".join(topics)), group=("READ", " or ".join(groups)))

    def _transact(self, slot: "_Slot", batch: list[CommitRequest], positions: dict[Any, list[TopicPartition]],
                  deadline: Deadline) -> None:
        """One Kafka transaction for `batch` on `slot`'s producer, within `deadline`."""
        try:
            producer = self._ready(slot, deadline.call_timeout(self._timeout))
        except (KafkaException, CallDeadlineExceeded) as exc:
            raise TransactionFailed.at(Stage.INIT, exc) from exc
        started = time.monotonic()
        try:
            transact(producer, [rec for req in batch for rec in req.records],
                     [(tps, receiver.group_metadata()) for receiver, tps in positions.items()],
                     deadline, self._timeout)
        finally:
            metrics.of(metrics.KAFKA_TRANSACTION_SECONDS, self._namespace).observe(time.monotonic() - started)

    def _settle(self, slot: "_Slot", failed: TransactionFailed, deadline: Deadline,
                positions: dict[Any, list[TopicPartition]], unclosed: Unclosed) -> bool | None:
        """Leave the failed transaction's producer ready or abandoned; whether the transaction
        committed (None: in doubt and not settled). See kbroker.core.txn.faults for why this is
        safe. One that did not commit is closed by the slot's next producer (left_open.py),
        unless Kafka refused it for itself (a record, the group's generation): then the broker
        was well and wrote its markers."""
        action = decide(failed.failure, deadline.left())
        closable = not failed.refused and not (failed.error is not None and failed.error.code() in GROUP_FENCES)
        if closable and action is not Action.RESOLVE:  # it did not commit
            slot.unclosed = unclosed
        log.warning("Kafka transaction failed at %s (%s): %s", failed.failure.stage.value, failed.reason,
                    action.value)
        if not failed.refused:  # a refused record says nothing of the producers' health
            self._recycle_idle(slot)
        if action is Action.ABORT:
            producer = slot.producer
            try:
                assert producer is not None  # a transaction began on it
                t = deadline.call_timeout(self._timeout, floor=1.0)
                producer.call("abort_transaction", lambda p: p.abort_transaction(t), t)
                # Never used again: the slot gets a new producer at its next use, whose init
                # bumps the producer epoch. A record of the aborted transaction whose answer was
                # lost (a network stall) keeps its idempotence sequence number in this producer:
                # the next transaction on it committed its offsets without its record, which the
                # broker most likely took for a retry of the aborted one (a reply lost in the
                # network-stall test; README, "An aborted transaction's producer is replaced").
                # A refused record, likewise, took a sequence number the broker never wrote (the
                # next one would fail, OUT_OF_ORDER_SEQUENCE_NUMBER).
                self._abandon(slot)
                return False
            except (KafkaException, CallDeadlineExceeded) as exc:
                log.error("abort_transaction failed (%s); replacing the transactional producer", reason(exc))
                action = Action.REPLACE
        self._abandon(slot)
        if action is Action.REPLACE:
            # Nothing was committed. Initialise the replacement now, if the broker answers: its
            # init aborts the old transaction, which frees the partitions it touched (a
            # read_committed reader waits at its records until then). If not, the next use tries.
            try:
                self._ready(slot, self._transaction_deadline)
            except (KafkaException, CallDeadlineExceeded) as exc:
                log.warning("no new transactional producer yet (%s); the next transaction retries", reason(exc))
            return False
        committed = self._resolve(slot, positions, unclosed)
        if committed is False and closable:
            slot.unclosed = unclosed
        return committed

    def _resolve(self, slot: "_Slot", positions: dict[Any, list[TopicPartition]], unclosed: Unclosed) -> bool | None:
        """Settle an in-doubt transaction: a new producer with the same transactional.id fences
        the old one (its init returns once the coordinator finished the old transaction), then
        the group's committed offsets say whether it committed. If they stay unreadable, the
        transaction was left open without its markers: Kafka's transaction log says how it
        ended, and the new producer closes it so. (Only with offsets: a transaction that sent
        none may never have reached the coordinator, and the log's last decision would be an
        earlier transaction's.)"""
        until = Deadline(self._resolve_timeout)
        left_open = LeftOpen(after=self._left_open_after)
        waited = False
        while not until.expired() and not self._closed:
            try:
                self._ready(slot, until.call_timeout(self._timeout, floor=1.0))
                if not positions:
                    return None  # no offsets to tell: the caller must check
                try:
                    sent, found = self._sent_and_found(positions, until)
                except UNREADABLE:
                    if left_open.due() and (closed := self._close_left_open(slot, unclosed, left_open, until)) is not None:
                        return closed
                    raise
                committed = committed_by_offsets(sent, found)
                log.warning("in-doubt Kafka transaction settled: %s", "committed" if committed else "aborted")
                return committed
            except UNREADABLE as exc:
                if not waited:
                    log.warning("cannot settle an in-doubt Kafka transaction yet (%s); retrying for up to %.0f s",
                                reason(exc), until.left())
                waited = True
                time.sleep(min(1.0, until.left()))
        log.error("an in-doubt Kafka transaction could not be settled in %.0f s", self._resolve_timeout)
        return None

    def _sent_and_found(self, positions: dict[Any, list[TopicPartition]],
                        until: Deadline) -> tuple[list[Position], list[Position]]:
        """The offsets an in-doubt transaction sent, and the groups' committed ones. When they
        cannot be read, the readers asked are dropped: a fresh one next time (one may ask a
        stale coordinator)."""
        sent: list[Position] = []
        found: list[Position] = []
        try:
            for receiver, tps in positions.items():
                sent += [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in tps]
                found += [(tp.topic, tp.partition, tp.offset, tp.metadata)
                          for tp in self._group_offsets(receiver.topic, tps,
                                                        until.call_timeout(self._timeout, floor=1.0))]
        except UNREADABLE:
            for receiver in positions:
                stale = self._offsets_readers.pop(receiver.topic, None)
                if stale is not None:
                    stale.close()
            raise
        return sent, found

    def _close_left_open(self, slot: "_Slot", unclosed: Unclosed, left_open: LeftOpen,
                         until: Deadline) -> bool | None:
        """How the in-doubt transaction ended, by Kafka's transaction log, once a transaction of
        the same producer id closed it so (left_open.py); None when the log cannot tell or the
        closing failed (the caller asks again)."""
        if left_open.outcome is None:
            try:
                history = transaction_history(self._cluster, names.reader_group(self._namespace),
                                              slot.transactional_id, unclosed.began - LOG_MARGIN,
                                              until.call_timeout(self._timeout, floor=1.0))
            except KBrokerError as exc:  # refused, or no broker: the offsets alone may still tell
                if left_open.first_failure():
                    log.warning("cannot read Kafka's transaction log to settle an in-doubt transaction (%s)", exc)
                return None
            left_open.outcome = outcome_before_init(history) if history is not None else None
            if left_open.outcome is None:
                if left_open.first_failure():
                    log.warning("Kafka's transaction log %s; the in-doubt transaction stays unsettled",
                                "does not say how it ended" if history is not None else "could not be read to its end")
                return None
        outcome = left_open.outcome
        try:
            if outcome.committed:
                close_committed(self._ready(slot, until.call_timeout(self._timeout, floor=1.0)), unclosed,
                                self._group_metadata, Deadline(self._transaction_deadline), self._timeout)
            else:  # the slot's next producer closes it, aborted
                slot.unclosed = unclosed.with_partitions(outcome.partitions)
                self._abandon(slot)
                self._ready(slot, until.call_timeout(self._timeout, floor=1.0))
        except (TransactionFailed, KafkaException, CallDeadlineExceeded) as exc:
            log.warning("closing a Kafka transaction left open failed (%s); trying again", reason(exc))
            self._abandon(slot)
            return None
        log.warning("in-doubt Kafka transaction settled by Kafka's transaction log: %s, its markers missing "
                    "(left open as the broker restarted); closed so", "committed" if outcome.committed else "aborted")
        return outcome.committed

    def _group_metadata(self, group: str) -> Any:
        """Group metadata of a consumer that never joins `group`: offsets a closing transaction
        sends with it are accepted whatever generation the group is in."""
        return self._offsets_reader(group).consumer_group_metadata()

    def _offsets_reader(self, group: str) -> Consumer:
        reader = self._offsets_readers.get(group)
        if reader is None:
            reader = self._offsets_readers[group] = offsets_reader(self._cluster, group)
        return reader

    def _group_offsets(self, group: str, positions: list[TopicPartition], seconds: float) -> list[TopicPartition]:
        """The group's stable committed offsets, asked by a consumer that never joins the group
        (reader.group_offsets): the queue's own consumer may be inside a rebalance that waits for
        this very commit (the revocation's barrier), and would not answer."""
        return without_errors(group_offsets(self._offsets_reader(group), positions, seconds))

    def _ready(self, slot: "_Slot", seconds: float) -> GuardedProducer:
        """`slot`'s producer, created and initialised (bounded by `seconds`) if it has none."""
        if slot.producer is not None and not slot.producer.abandoned:
            return slot.producer
        deadline = Deadline(seconds)
        producer = self._start(slot, seconds)
        if slot.unclosed is not None:
            try:
                close_aborted(producer, slot.unclosed, self._group_metadata, deadline,
                              deadline.call_timeout(self._timeout, floor=1.0))
            except TransactionFailed as failed:  # its callers expect the call's own error
                assert isinstance(failed.__cause__, (KafkaException, CallDeadlineExceeded))
                raise failed.__cause__ from None
            finally:
                producer.abandon()  # as after any abort: the next one's sequence numbers start afresh
            slot.unclosed = None
            producer = self._start(slot, deadline.call_timeout(self._timeout, floor=1.0))
        slot.producer = producer
        self.generation += 1
        return producer

    def _start(self, slot: "_Slot", seconds: float) -> GuardedProducer:
        return started(self._make_producer({**self._conf, "transactional.id": slot.transactional_id}),
                       slot.transactional_id, seconds)

    def _restock(self) -> None:
        """While idle, give every slot whose producer was abandoned a new one. Its init fences
        the abandoned producer at once, which aborts the transaction it left open: until then
        that transaction's pending offsets keep the queue's committed offsets unstable (an
        assignment cannot read them) and its records hold back read_committed readers."""
        for slot in self._ring:
            if slot.producer is None and not self._closed:
                try:
                    self._ready(slot, self._transaction_deadline)
                    log.warning("transactional producer %s replaced", slot.transactional_id)
                except (KafkaException, CallDeadlineExceeded) as exc:
                    log.warning("no new transactional producer yet (%s); trying again", reason(exc))

    def _recycle_idle(self, failed: "_Slot") -> None:
        """After a failed transaction, give the ring's other (idle) producers up too; the next
        use creates them anew. A producer that lived through a broker restart was seen to hang in
        its next send_offsets_to_transaction (a stale coordinator, librdkafka #5511), and its
        replacement then aborted that transaction. Worse, a transaction of it that committed
        just as the broker stopped can be left without its markers (the broker's coordinator
        says committed, the partitions hold it open: its offsets stay unstable); the next marker
        of the same producer id settles it, so that must be a commit, not the abort of a hung
        call. A fresh producer's init finds no open transaction (nothing is aborted) and its
        first commit closes the left-over one as committed."""
        for other in self._ring:
            if other is not failed and other.producer is not None:
                self._abandon(other)

    def _abandon(self, slot: "_Slot") -> None:
        if slot.producer is not None:
            slot.producer.abandon()
            slot.producer = None

    def _without_outdated(self, batch: list[CommitRequest]) -> list[CommitRequest]:
        """Fail the requests whose conversation leases were checked before the producer that
        would commit them was created (the slot's producer is made ready first, so the
        generation is the one the Kafka transaction will run on)."""
        slot = self._ring[self._turn]
        if slot.producer is None or slot.producer.abandoned:
            try:
                self._ready(slot, self._timeout)
            except (KafkaException, CallDeadlineExceeded):
                pass  # the transaction meets it again and fails as any other
        outdated = [r for r in batch if r.generation is not None and r.generation < self.generation]
        for req in outdated:
            req.finish(TransactionAbortedError(
                "a transactional producer was replaced while this transaction held conversation leases; "
                "another process may have taken one over"))
        return [r for r in batch if r not in outdated] if outdated else batch

    def _split_doomed(self, batch: list[CommitRequest]) -> None:
        doomed = [r for r in batch if any(l.doomed for l in r.leases)]
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
        for reader in self._offsets_readers.values():
            reader.close()
        self._offsets_readers.clear()
        for slot in self._ring:  # their threads end, and librdkafka's producers with them
            self._abandon(slot)
