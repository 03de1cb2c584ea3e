"""Settling a group commit whose Kafka transaction failed: what becomes of its producer, and
whether the transaction committed.

kbroker.core.txn.faults decides from the stage a call failed in. Before the commit was asked for,
nothing committed: the transaction is aborted on its producer, or the producer is replaced
(whose init aborts it). Once commit_transaction was asked and did not answer, the outcome is in
doubt: a new producer with the same transactional.id fences the old one (its init returns once
the coordinator finished the old transaction), then the queue group's committed offsets say
whether it committed. If they stay unreadable, it is an open transaction, its markers missing (a
broker restart left it so): Kafka's transaction log (`__transaction_state`) says how it ended,
and the slot's next producer closes it so (close_open.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.core.txn.faults import Action, Deadline, Position, committed_by_offsets, decide
from kbroker.core.txn.transaction_log import OpenTransactionCheck, outcome_before_init
from kbroker.errors import KBrokerError
from kbroker.kafka.snapshot import group_offsets, offsets_reader, without_errors
from kbroker.kafka.txn.close_open import OpenTransaction, close_open_committed
from kbroker.kafka.txn.guarded import CallDeadlineExceeded, TransactionFailed, reason
from kbroker.kafka.txn.producer_ring import ProducerRing, Slot
from kbroker.kafka.txn.transaction_log import transaction_history

log = logging.getLogger("kbroker.committer")

# What a read of committed offsets, or a producer's init, fails with while the broker cannot answer.
UNREADABLE = (KafkaException, CallDeadlineExceeded, concurrent.futures.TimeoutError)

# The transaction log is read from this long before an in-doubt transaction began (clocks differ).
LOG_MARGIN = 60.0

# What send_offsets_to_transaction meets when the queue's group moved on to a new generation
# since the offsets' group metadata was taken (a reader joined or left): a fence, not a fault.
GROUP_FENCES = frozenset(
    getattr(KafkaError, name)
    for name in (
        "ILLEGAL_GENERATION",
        "UNKNOWN_MEMBER_ID",
        "REBALANCE_IN_PROGRESS",
        "FENCED_INSTANCE_ID",
        "FENCED_MEMBER_EPOCH",
        "STALE_MEMBER_EPOCH",
    )
    if hasattr(KafkaError, name)
)

Positions = dict[Any, list[TopicPartition]]  # a transaction's offsets per queue receiver


class Settler:
    """Settles the committer's failed Kafka transactions on the ring's producers. Reads the
    queue groups' committed offsets with consumers of its own that never join the groups."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        ring: ProducerRing,
        *,
        timeout: float,
        transaction_deadline: float,
        resolve_timeout: float,
        open_transaction_after: float,
        closed: Callable[[], bool],
    ):
        self._cluster, self._namespace, self._ring = cluster, namespace, ring
        self._timeout, self._transaction_deadline = timeout, transaction_deadline
        self._resolve_timeout = resolve_timeout  # how long an in-doubt commit may take to settle
        # Unreadable offsets for this long: an open transaction, ask the transaction log.
        self._open_transaction_after = open_transaction_after
        self._closed = closed  # whether the committer is closing: settling gives up then
        # Per queue group: a consumer that reads its committed offsets, to settle an in-doubt commit.
        self._offsets_readers: dict[str, Consumer] = {}

    def settle(
        self, slot: Slot, failed: TransactionFailed, deadline: Deadline, positions: Positions, open_txn: OpenTransaction
    ) -> bool | None:
        """Leave the failed transaction's producer ready or abandoned; whether the transaction
        committed (None: in doubt and not settled). See kbroker.core.txn.faults for why this is
        safe. One that did not commit is closed by the slot's next producer (close_open.py),
        unless Kafka refused it for itself (a record, the group's generation): then the broker
        was well and wrote its markers."""
        action = decide(failed.failure, deadline.left())
        closable = not failed.refused and not (failed.error is not None and failed.error.code() in GROUP_FENCES)
        if closable and action is not Action.RESOLVE:  # it did not commit
            slot.open_transaction = open_txn
        log.warning("Kafka transaction failed at %s (%s): %s", failed.failure.stage.value, failed.reason, action.value)
        if not failed.refused:  # a refused record says nothing of the producers' health
            self._ring.recycle_idle(slot)
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
                self._ring.abandon(slot)
                return False
            except (KafkaException, CallDeadlineExceeded) as exc:
                log.error("abort_transaction failed (%s); replacing the transactional producer", reason(exc))
                action = Action.REPLACE
        self._ring.abandon(slot)
        if action is Action.REPLACE:
            # Nothing was committed. Initialise the replacement now, if the broker answers: its
            # init aborts the old transaction, which frees the partitions it touched (a
            # read_committed reader waits at its records until then). If not, the next use tries.
            try:
                self._ring.ready(slot, self._transaction_deadline)
            except (KafkaException, CallDeadlineExceeded) as exc:
                log.warning("no new transactional producer yet (%s); the next transaction retries", reason(exc))
            return False
        committed = self._resolve(slot, positions, open_txn)
        if committed is False and closable:
            slot.open_transaction = open_txn
        return committed

    def _resolve(self, slot: Slot, positions: Positions, open_txn: OpenTransaction) -> bool | None:
        """Settle an in-doubt transaction: a new producer with the same transactional.id fences
        the old one (its init returns once the coordinator finished the old transaction), then
        the group's committed offsets say whether it committed. If they stay unreadable, it is
        an open transaction without its markers: Kafka's transaction log says how it ended, and
        the new producer closes it so. (Only with offsets: a transaction that sent none may
        never have reached the coordinator, and the log's last decision would be an earlier
        transaction's.)"""
        until = Deadline(self._resolve_timeout)
        check = OpenTransactionCheck(after=self._open_transaction_after)
        waited = False
        while not until.expired() and not self._closed():
            try:
                self._ring.ready(slot, until.call_timeout(self._timeout, floor=1.0))
                if not positions:
                    return None  # no offsets to tell: the caller must check
                try:
                    sent, found = self._sent_and_found(positions, until)
                except UNREADABLE:
                    if check.due() and (closed := self._close_open(slot, open_txn, check, until)) is not None:
                        return closed
                    raise
                committed = committed_by_offsets(sent, found)
                log.warning("in-doubt Kafka transaction settled: %s", "committed" if committed else "aborted")
                return committed
            except UNREADABLE as exc:
                if not waited:
                    log.warning(
                        "cannot settle an in-doubt Kafka transaction yet (%s); retrying for up to %.0f s",
                        reason(exc),
                        until.left(),
                    )
                waited = True
                time.sleep(min(1.0, until.left()))
        log.error("an in-doubt Kafka transaction could not be settled in %.0f s", self._resolve_timeout)
        return None

    def _sent_and_found(self, positions: Positions, until: Deadline) -> tuple[list[Position], list[Position]]:
        """The offsets an in-doubt transaction sent, and the groups' committed ones. When they
        cannot be read, the readers asked are dropped: a fresh one next time (one may ask a
        stale coordinator)."""
        sent: list[Position] = []
        found: list[Position] = []
        try:
            for receiver, tps in positions.items():
                sent += [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in tps]
                found += [
                    (tp.topic, tp.partition, tp.offset, tp.metadata)
                    for tp in self.group_offsets(receiver.topic, tps, until.call_timeout(self._timeout, floor=1.0))
                ]
        except UNREADABLE:
            for receiver in positions:
                stale = self._offsets_readers.pop(receiver.topic, None)
                if stale is not None:
                    stale.close()
            raise
        return sent, found

    def _close_open(
        self, slot: Slot, open_txn: OpenTransaction, check: OpenTransactionCheck, until: Deadline
    ) -> bool | None:
        """How the in-doubt transaction ended, by Kafka's transaction log, once a transaction of
        the same producer id closed it so (close_open.py); None when the log cannot tell or the
        closing failed (the caller asks again)."""
        if check.outcome is None:
            try:
                history = transaction_history(
                    self._cluster,
                    names.reader_group(self._namespace),
                    slot.transactional_id,
                    open_txn.began - LOG_MARGIN,
                    until.call_timeout(self._timeout, floor=1.0),
                )
            except KBrokerError as exc:  # refused, or no broker: the offsets alone may still tell
                if check.first_failure():
                    log.warning("cannot read Kafka's transaction log to settle an in-doubt transaction (%s)", exc)
                return None
            check.outcome = outcome_before_init(history) if history is not None else None
            if check.outcome is None:
                if check.first_failure():
                    log.warning(
                        "Kafka's transaction log %s; the in-doubt transaction stays unsettled",
                        "does not say how it ended" if history is not None else "could not be read to its end",
                    )
                return None
        outcome = check.outcome
        try:
            if outcome.committed:
                close_open_committed(
                    self._ring.ready(slot, until.call_timeout(self._timeout, floor=1.0)),
                    open_txn,
                    self.group_metadata,
                    Deadline(self._transaction_deadline),
                    self._timeout,
                )
            else:  # the slot's next producer closes it, aborted
                slot.open_transaction = open_txn.with_partitions(outcome.partitions)
                self._ring.abandon(slot)
                self._ring.ready(slot, until.call_timeout(self._timeout, floor=1.0))
        except (TransactionFailed, KafkaException, CallDeadlineExceeded) as exc:
            log.warning("closing an open Kafka transaction failed (%s); trying again", reason(exc))
            self._ring.abandon(slot)
            return None
        log.warning(
            "in-doubt Kafka transaction settled by Kafka's transaction log: %s, an open transaction "
            "without its markers (as the broker restarted); closed so",
            "committed" if outcome.committed else "aborted",
        )
        return outcome.committed

    def group_metadata(self, group: str) -> Any:
        """Group metadata of a consumer that never joins `group`: offsets a closing transaction
        sends with it are accepted whatever generation the group is in."""
        return self._offsets_reader(group).consumer_group_metadata()

    def _offsets_reader(self, group: str) -> Consumer:
        reader = self._offsets_readers.get(group)
        if reader is None:
            reader = self._offsets_readers[group] = offsets_reader(self._cluster, group)
        return reader

    def group_offsets(self, group: str, positions: list[TopicPartition], seconds: float) -> list[TopicPartition]:
        """The group's stable committed offsets, asked by a consumer that never joins the group
        (reader.group_offsets): the queue's own consumer may be inside a rebalance that waits for
        this very commit (the revocation's barrier), and would not answer."""
        return without_errors(group_offsets(self._offsets_reader(group), positions, seconds))

    def close(self) -> None:
        """Close the offsets readers."""
        for reader in self._offsets_readers.values():
            reader.close()
        self._offsets_readers.clear()
