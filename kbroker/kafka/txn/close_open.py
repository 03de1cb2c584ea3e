"""Closing an open Kafka transaction that a broker restart may have left.

Kafka's transaction coordinator can record a transaction complete without writing its markers
to a partition it takes for deleted (a one-node broker starting, or stopping with controlled
shutdown: README, "A transaction the broker left open"). The partition then holds the
transaction open for good: read_committed readers stop at it, and a queue group's committed
offsets it carries stay unstable, so the partition is never assigned. Only a later transaction
of the same producer id ending on that partition closes it, with its own marker's outcome.

So after a transaction that did not commit (it failed while the broker may have been away), the
slot's next producer, before its first transaction, runs one that writes an empty record to
every partition of the failed transaction's topics and sends its offsets, and aborts it: its
abort markers close whatever open transaction is there as aborted, and its records are never
read. Where the markers were written, it changes nothing. An in-doubt transaction that Kafka's
transaction log shows committed is closed the other way: its offsets are sent and committed
again (the same values), which closes the group's offsets partition as committed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from confluent_kafka import TopicPartition

from kbroker.core.txn.faults import Deadline
from kbroker.kafka.txn.guarded import GuardedProducer, transact

CLOSING_KEY = b"kbroker-closing"

GroupMetadata = Callable[[str], Any]  # a queue group -> group metadata to send offsets with


@dataclass(frozen=True)
class OpenTransaction:
    """What a failed transaction, perhaps still open, touched: the topics its records went to
    (their partitions are not all known: the partitioner chose), partitions named otherwise
    (Kafka's transaction log), its offsets per queue group, and when it began (epoch s)."""

    topics: frozenset[str]
    partitions: frozenset[tuple[str, int]]
    offsets: tuple[tuple[str, tuple[TopicPartition, ...]], ...]
    began: float

    @classmethod
    def of(cls, topics: frozenset[str], positions: dict[Any, list[TopicPartition]], began: float) -> OpenTransaction:
        """From a batch's record topics and its offsets per receiver (a queue's group is named
        as its topic)."""
        return cls(topics, frozenset(), tuple((r.topic, tuple(tps)) for r, tps in positions.items()), began)

    def with_partitions(self, partitions: frozenset[tuple[str, int]]) -> OpenTransaction:
        return replace(self, partitions=self.partitions | partitions)


def close_open_aborted(
    producer: GuardedProducer, open_txn: OpenTransaction, group_metadata: GroupMetadata, deadline: Deadline, cap: float
) -> None:
    """Close `open_txn` as aborted on `producer` (just initialised, same transactional id):
    an empty record to each of its partitions, its offsets, abort. TransactionFailed when it
    did not end so; the producer must then be abandoned."""
    parts = set(open_txn.partitions)
    if open_txn.topics:
        # One metadata request for every topic, none naming a topic (which could create it).
        t = deadline.call_timeout(cap)
        meta = producer.call("list_topics", lambda p: p.list_topics(timeout=t), t)
        for topic in open_txn.topics:
            found = meta.topics.get(topic)
            if found is not None and found.error is None:
                parts.update((topic, p) for p in found.partitions)
    placed = sorted(parts)
    transact(
        producer,
        [(topic, CLOSING_KEY, b"", None) for topic, _ in placed],
        _offsets(open_txn, group_metadata),
        deadline,
        cap,
        partitions=[p for _, p in placed],
        abort=True,
    )


def close_open_committed(
    producer: GuardedProducer, open_txn: OpenTransaction, group_metadata: GroupMetadata, deadline: Deadline, cap: float
) -> None:
    """Close `open_txn`'s offsets as committed: the same offsets, committed again by the same
    transactional id. TransactionFailed when it did not commit."""
    transact(producer, [], _offsets(open_txn, group_metadata), deadline, cap)


def _offsets(open_txn: OpenTransaction, group_metadata: GroupMetadata) -> list[tuple[list[TopicPartition], Any]]:
    return [(list(tps), group_metadata(group)) for group, tps in open_txn.offsets]
