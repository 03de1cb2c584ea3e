"""A transactional producer whose blocking calls kbroker bounds itself.

librdkafka does not always honour the timeout a transaction call is given: after a broker
restart, send_offsets_to_transaction has been seen to block for ever (librdkafka issues #5456,
#5511). A GuardedProducer runs every call on a thread of its own and stops waiting at the
deadline; the producer is then abandoned for good (a call may still be running inside it, so it
is never used again) and its thread drops it once that call returns.

`transact` runs one whole Kafka transaction on such a producer (begin, produce, send offsets,
commit), every call within one deadline; the group committer, the timer service and the
dispatcher use it. After a failure the committer and the timer service decide what to do with
kbroker.core.txn.faults; `aborted` and `replace_producer` are the timer service's and the
dispatcher's two ways to leave a producer ready.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import queue
import threading
import time
from typing import Any, Callable, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kbroker.core.cluster import ClusterLike
from kbroker.core.records import Record
from kbroker.core.txn.faults import Action, Deadline, Failure, Stage, decide
from kbroker.errors import denied_code
from kbroker.kafka import clients, messages

log = logging.getLogger("kbroker.committer")

T = TypeVar("T")

# librdkafka is given the call's timeout and kbroker waits this much longer, so a call that
# honours its timeout fails with librdkafka's own error (more telling) rather than kbroker's.
GRACE = 1.0


class CallDeadlineExceeded(Exception):
    """A producer call did not return by kbroker's deadline; the producer is abandoned."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"{what} did not return within {seconds:.1f} s")
        self.what, self.seconds = what, seconds


class GuardedProducer:
    """A librdkafka producer used only through call(), which waits at most a deadline."""

    def __init__(self, producer: Producer, name: str):
        self.name = name
        self._producer: Producer | None = producer
        self._calls: queue.Queue[tuple[Callable[[Producer], Any], concurrent.futures.Future[Any]] | None] = (
            queue.Queue()
        )
        self.abandoned = False
        self._thread = threading.Thread(target=self._serve, name=f"kbroker-txn-{name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                break
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                assert self._producer is not None  # dropped only after the last call
                future.set_result(fn(self._producer))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
        # The last reference: librdkafka's destroy runs here, never on the committer's thread.
        self._producer = None

    def call(self, what: str, fn: Callable[[Producer], T], seconds: float) -> T:
        """fn(producer) on the producer's thread; its result or exception, or
        CallDeadlineExceeded (and the producer abandoned) after `seconds` + GRACE."""
        if self.abandoned:
            raise CallDeadlineExceeded(what, 0.0)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((fn, future))
        try:
            return future.result(timeout=seconds + GRACE)
        except concurrent.futures.TimeoutError:
            log.error(
                "%s on transactional producer %s did not return within %.1f s: abandoning it",
                what,
                self.name,
                seconds + GRACE,
            )
            self.abandon()
            raise CallDeadlineExceeded(what, seconds + GRACE) from None

    def abandon(self) -> None:
        """Never use this producer again; its thread ends (and drops it) once any running call
        returns."""
        if not self.abandoned:
            self.abandoned = True
            self._calls.put(None)


def started(producer: Producer, transactional_id: str, seconds: float) -> GuardedProducer:
    """`producer` (configured with `transactional_id`) guarded and initialised within `seconds`:
    its init fences any earlier producer of that id and ends the open transaction it left. A
    failed init abandons it and raises."""
    guarded = GuardedProducer(producer, transactional_id)
    try:
        guarded.call("init_transactions", lambda raw: raw.init_transactions(seconds), seconds)
    except BaseException:
        guarded.abandon()
        raise
    return guarded


def started_for(cluster: ClusterLike, producer: Producer, transactional_id: str, seconds: float) -> GuardedProducer:
    """started(), for a service that cannot go on without its producer (the timer service, the
    dispatcher, the analytics job): the authorizer's refusal of its transactional id raised as
    a PermissionDeniedError naming the id, rather than a KafkaException it would retry."""
    try:
        return started(producer, transactional_id, seconds)
    except KafkaException as exc:
        if denied_code(exc.args[0]):
            raise clients.denied(
                cluster, exc.args[0], "starting a transactional producer", transactional_id=("WRITE", transactional_id)
            ) from None
        raise


def service_producer(cluster: ClusterLike, transactional_id: str, seconds: float = 30.0) -> GuardedProducer:
    """started_for() of an idempotent producer with `transactional_id`, a 10 s transaction time-out
    and a 5 ms retry back-off: what a service that moves records in transactions of its own starts
    (the timer service, the delayed store's mover, a bridge's pusher), and starts again to fence its past."""
    settings = {"transactional.id": transactional_id, "transaction.timeout.ms": 10_000, "retry.backoff.ms": 5}
    return started_for(cluster, clients.idempotent_producer(cluster, **settings), transactional_id, seconds)


def aborted(producer: GuardedProducer, seconds: float) -> bool:
    """Abort `producer`'s open transaction within `seconds`; False when that failed (the producer
    must be replaced)."""
    try:
        producer.call("abort_transaction", lambda raw: raw.abort_transaction(seconds), seconds)
        return True
    except (KafkaException, CallDeadlineExceeded):
        return False


def replace_producer(
    old: GuardedProducer,
    new: Callable[[], GuardedProducer],
    stop: threading.Event,
    failed: Callable[[BaseException], None],
) -> GuardedProducer:
    """Abandon `old` and start its replacement, `new()` (whose init fences `old` and ends the
    open transaction it left), trying again every second (each failure to `failed`) until one
    starts or `stop` is set; then `old`, abandoned (its every call fails)."""
    old.abandon()
    while not stop.is_set():
        try:
            return new()
        except (KafkaException, CallDeadlineExceeded) as exc:
            failed(exc)
            stop.wait(1.0)
    return old


class TransactionFailed(Exception):
    """A Kafka transaction stopped: at which stage and how (the pure module's Failure), and why."""

    def __init__(self, failure: Failure, reason: str, error: KafkaError | None = None):
        super().__init__(reason)
        self.failure, self.reason = failure, reason
        self.error = error  # librdkafka's error, when it was one (not kbroker's deadline)
        # Records Kafka refused for themselves (index in the transaction's records -> why): the
        # transaction failed because of them, and without them it would not have.
        self.refused: dict[int, str] = {}

    @classmethod
    def at(cls, stage: Stage, exc: BaseException) -> "TransactionFailed":
        """librdkafka's error (or kbroker's deadline) at `stage`."""
        if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
            err = exc.args[0]
            return cls(
                Failure(stage, fatal=err.fatal(), retriable=err.retriable(), requires_abort=err.txn_requires_abort()),
                reason(exc),
                err,
            )
        return cls(Failure(stage, timed_out=isinstance(exc, CallDeadlineExceeded)), reason(exc))


def reason(exc: BaseException) -> str:
    """A failed call's error in one line: librdkafka's text, or the exception's."""
    if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    return str(exc)


def transact(
    producer: GuardedProducer,
    records: list[Record],
    offsets: list[tuple[list[TopicPartition], Any]],
    deadline: Deadline,
    cap: float,
    *,
    partitions: list[int] | None = None,
    abort: bool = False,
) -> None:
    """One Kafka transaction: begin, produce `records`, send each (positions, consumer group
    metadata) of `offsets`, commit (asked again while faults.decide says so). Every call gets
    what is left of `deadline`, at most `cap` seconds; TransactionFailed says where it stopped.
    `partitions`: each record's partition, where the partitioner must not choose. `abort`: end
    with an abort instead (a transaction that only closes others: kafka/txn/close_open.py)."""
    stage = [Stage.BEGIN]  # where the producer's thread is: the failure's stage
    refused: dict[int, str] = {}

    def run(p: Producer) -> None:
        p.begin_transaction()
        stage[0] = Stage.PRODUCE
        _produce_all(p, records, deadline, refused, partitions)
        stage[0] = Stage.OFFSETS
        for positions, group in offsets:
            p.send_offsets_to_transaction(positions, group, deadline.call_timeout(cap))
        if abort:
            stage[0] = Stage.ABORT
            p.abort_transaction(deadline.call_timeout(cap))
            return
        stage[0] = Stage.COMMIT
        while True:
            try:
                p.commit_transaction(deadline.call_timeout(cap))
                return
            except KafkaException as exc:
                if decide(TransactionFailed.at(Stage.COMMIT, exc).failure, deadline.left()) is not Action.RETRY_COMMIT:
                    raise
                log.warning("commit_transaction failed retriably (%s); asking again", exc.args[0].str())

    try:
        # One call on the producer's thread for the whole transaction: a hand-off per call (four)
        # cost 0.3 ms of a dialog's round trip. Each librdkafka call inside still gets what is
        # left of the deadline (at most `cap`), and the wait here ends with the deadline.
        producer.call("a Kafka transaction", run, max(deadline.left(), 0.1))
    except (KafkaException, CallDeadlineExceeded) as exc:
        if isinstance(exc, CallDeadlineExceeded):
            exc = CallDeadlineExceeded(stage[0].value, exc.seconds)
        failed = TransactionFailed.at(stage[0], exc)
        if isinstance(exc, KafkaException):
            _serve_reports(producer, refused, exc)
        failed.refused = refused
        raise failed from exc


def _serve_reports(producer: GuardedProducer, refused: dict[int, str], exc: KafkaException) -> None:
    """Serve the delivery reports that are in, so `refused` names the records Kafka refused.
    A refusal fails the transaction before its report is served, and may even before it is
    queued (both happen on librdkafka's broker thread): when the failure is a refusal, wait for
    its report up to a second."""
    err = exc.args[0]
    expect = isinstance(err, KafkaError) and err.code() in RECORD_REFUSALS
    until = time.monotonic() + (1.0 if expect else 0.0)
    while True:
        try:
            producer.call("poll", lambda p: p.poll(0.05 if expect else 0), 1.0)
        except (KafkaException, CallDeadlineExceeded):
            return
        if refused or time.monotonic() >= until:
            return


# Kafka's answers that refuse one record for what it is, not for the state of the transaction,
# the producer or the cluster: the same record is refused every time.
RECORD_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
    }
)


class _Refusals:
    """Delivery reports of one transaction's records: which ones Kafka refused, by index."""

    def __init__(self, refused: dict[int, str]):
        self.refused = refused

    def delivered(self, index: int, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and err.code() in RECORD_REFUSALS:
            self.refused[index] = str(err.str())


def _produce_all(
    producer: Producer, records: list[Record], deadline: Deadline, refused: dict[int, str], partitions: list[int] | None
) -> None:
    reports = _Refusals(refused)
    for index, (topic, key, value, headers) in enumerate(records):
        try:
            clients.produce(
                producer,
                topic,
                until=deadline.expired,
                key=key,
                value=value,
                headers=messages.wire_headers(headers),
                on_delivery=functools.partial(reports.delivered, index),
                **({} if partitions is None else {"partition": partitions[index]}),
            )
        except KafkaException as exc:  # refused before it was sent: over the producer's own limit
            if isinstance(exc.args[0], KafkaError):
                reports.delivered(index, exc.args[0], None)
            raise
