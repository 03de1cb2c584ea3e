"""Ending a dead reader's open Kafka transaction, so its partitions' next owner need not wait.

A partition handed to this process whose committed offsets cannot be read stably is held by an
open Kafka transaction. With the classic group protocol's cooperative rebalances a partition
moves only in a generation after its owner has given it up, and a live owner finishes any
transaction carrying its offsets before it does (kafka/receive/partition_assignment.py, the
commit barrier): so an open transaction then is a dead or expelled process's. Kafka would abort
it after transaction.timeout.ms and its check interval (11 s on the embedded broker, up to 20 s
at Kafka's defaults); fencing the transactional ids that the partition's last committed offsets
name (core/txn/commit_holder.py) aborts it at once.

Not covered: a process that died inside its first commit of the partition (the last committed
offsets name an earlier owner, fenced for nothing: a live one sees a retriable abort) or whose
offsets carry no holder; Kafka's timeout still ends those.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kbroker.core.cluster import ClusterLike
from kbroker.core.txn.commit_holder import holder_ids
from kbroker.kafka.snapshot import group_offsets, offsets_reader
from kbroker.kafka.txn.fencing import fence
from kbroker.kafka.txn.guarded import reason

log = logging.getLogger("kbroker.receiver")

FENCE_AFTER = 1.0  # seconds a handed partition waits for its offsets before its holder is fenced
REFENCE_AFTER = 15.0  # the same ids are fenced again only after this long (a holder that came back)
FENCE_TIMEOUT = 10.0  # seconds per transactional id


class OpenTransactionFence:
    """Fences the process named by the committed offsets of partitions that wait (never this
    process: `own_ids`). Called on a thread of its own, never the poll thread."""

    def __init__(self, cluster: ClusterLike, namespace: str, group: str, own_ids: tuple[str, ...]):
        self._cluster, self._namespace, self._group = cluster, namespace, group
        self._own = set(own_ids)
        self._fenced: dict[str, float] = {}  # transactional id -> when fenced (monotonic)
        self._reader: Consumer | None = None

    def __call__(self, waiting: list[TopicPartition]) -> tuple[str, ...]:
        """Fence the holders of `waiting`'s last committed offsets; the ids fenced."""
        if self._reader is None:
            self._reader = offsets_reader(self._cluster, self._group, stable=False)
        try:
            committed = group_offsets(self._reader, waiting, FENCE_TIMEOUT)
        except KafkaException as exc:
            log.warning(
                "committed offsets of %s not read to find an open transaction's holder (%s)", self._group, reason(exc)
            )
            return ()
        now = time.monotonic()
        ids = [tid for tp in committed if tp.error is None for tid in holder_ids(tp.metadata, self._namespace)]
        due = tuple(
            tid
            for tid in dict.fromkeys(ids)
            if tid not in self._own and now - self._fenced.get(tid, float("-inf")) >= REFENCE_AFTER
        )
        if due:
            log.warning(
                "partitions %s of %s wait for an open Kafka transaction; fencing %s, the "
                "transactional ids their last committed offsets name",
                sorted(tp.partition for tp in waiting),
                self._group,
                ", ".join(due),
            )
            fence(self._cluster, due, FENCE_TIMEOUT)
            self._fenced.update((tid, now) for tid in due)
        return due

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
