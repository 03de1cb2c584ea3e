"""What the analytics path writes to Kafka and reads back besides Spark's own source: the job's
results (analytics and control records, one Kafka transaction per batch), the worker's receive
progress snapshots, and the worker's reading of the control topic."""

from __future__ import annotations

import time
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.analytics.analytics_records import control_command
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.receive.offsets import decode_completed
from kbroker.core.receive.reclaim import recent_positions
from kbroker.core.records import Record
from kbroker.core.rejected import Rejected
from kbroker.core.txn.faults import Deadline
from kbroker.errors import BrokerUnavailableError, denied_code, kafka_error
from kbroker.kafka import clients
from kbroker.kafka.activation.counting_clients import CountingClients
from kbroker.kafka.receive.reclaim import log_starts
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import committed_offsets, reading_consumer, topic_partitions
from kbroker.kafka.txn.guarded import (
    CallDeadlineExceeded,
    GuardedProducer,
    TransactionFailed,
    reason,
    started_for,
    transact,
)


class ResultsWriter:
    """The analytics job's producer. One transactional id per namespace: a second job of the same
    namespace fences this one, and a batch's records land all or none. Every call is bounded by
    kbroker (kafka/txn/guarded.py: librdkafka's send_offsets_to_transaction was seen here to block for
    good after a broker restart); after any failure the producer is replaced, and the batch fails,
    so Spark runs it again from the state before it."""

    def __init__(self, cluster: ClusterLike, namespace: str, timeout: float = 30.0):
        self.cluster, self.namespace, self.timeout = Cluster.of(cluster), namespace, timeout
        # Never subscribes: it only lends the group's id to the offsets each batch commits, which
        # tell the 5th-tick reclaim what the job has read (core/receive/reclaim.py).
        self._group = clients.consumer(cluster, names.analytics_group(namespace))
        self._producer: GuardedProducer | None = None

    def check(self) -> None:
        """Start the producer now: PermissionDeniedError at once when its transactional id is
        refused, rather than at the first batch."""
        self._ready()

    def _ready(self) -> GuardedProducer:
        if self._producer is None or self._producer.abandoned:
            tid = names.analytics_transactional_id(self.namespace)
            try:
                self._producer = started_for(
                    self.cluster,
                    clients.idempotent_producer(
                        self.cluster, **{"transactional.id": tid, "transaction.timeout.ms": 60000}
                    ),
                    tid,
                    self.timeout,
                )
            except (KafkaException, CallDeadlineExceeded) as exc:
                raise BrokerUnavailableError(f"the analytics job's producer could not start: {reason(exc)}") from None
        return self._producer

    def hold_unread(self) -> int:
        """At the job's start, the log start as the position of every queue partition the group
        has no recent position for, so the 5th-tick reclaim keeps what the job has not read yet
        (core/receive/reclaim.py): its first batch commits no position for a queue with nothing new (it
        knows no end offsets before its first), and received records were deleted under it, never
        counted. Returns how many positions it wrote."""
        admin = clients.admin(self.cluster)
        head = names.prefix(self.namespace) + "queue."
        try:
            topics = admin.list_topics(timeout=self.timeout).topics
        except KafkaException as exc:
            raise BrokerUnavailableError(f"cannot list the queue topics: {exc.args[0]}") from None
        tps = [
            TopicPartition(t, p)
            for t, meta in sorted(topics.items())
            if t.startswith(head)
            for p in sorted(meta.partitions)
        ]
        if not tps:
            return 0
        read = committed_offsets(self.cluster, names.analytics_group(self.namespace), tps, self.timeout, stable=False)
        recent = recent_positions(
            {(tp.topic, tp.partition): (tp.offset, tp.metadata) for tp in read if tp.error is None},
            int(time.time() * 1000),
        )
        positions: dict[tuple[str, int], int] = {}
        for topic in sorted({tp.topic for tp in tps}):
            unheld = [tp for tp in tps if tp.topic == topic and (topic, tp.partition) not in recent]
            if unheld:
                starts = log_starts(admin, topic, unheld, self.timeout)
                positions.update({(topic, p): start for p, start in starts.items()})
        self.write([], [], positions)
        return len(positions)

    def write(
        self,
        analytics: list[tuple[str, dict[str, Any]]],
        commands: list[tuple[str, dict[str, Any]]],
        positions: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """One batch's records, and `positions` ((topic, partition) -> the next offset the job
        reads) as the analytics group's committed offsets, in one transaction."""
        if not analytics and not commands and not positions:
            return
        records: list[Record] = [
            (topic, key.encode(), orjson.dumps(value), None)
            for topic, batch in (
                (names.analytics_topic(self.namespace), analytics),
                (names.control_topic(self.namespace), commands),
            )
            for key, value in batch
        ]
        offsets = []
        if positions:
            at = str(int(time.time() * 1000))
            offsets = [
                (
                    [TopicPartition(t, part, o, metadata=at) for (t, part), o in sorted(positions.items())],
                    self._group.consumer_group_metadata(),
                )
            ]
        producer = self._ready()
        try:
            transact(producer, records, offsets, Deadline(self.timeout), self.timeout)
        except TransactionFailed as failed:
            # Whatever decide() would say, the batch fails and runs again: a new producer (the
            # same id) fences this one and ends its transaction, committed or not.
            producer.abandon()
            if failed.error is not None and denied_code(failed.error):  # it would fail again: not retriable
                raise clients.denied(
                    self.cluster,
                    failed.error,
                    "writing the analytics results",
                    topic=(
                        "WRITE",
                        f"{names.analytics_topic(self.namespace)} or {names.control_topic(self.namespace)}",
                    ),
                    group=("READ", names.analytics_group(self.namespace)),
                    transactional_id=("WRITE", names.analytics_transactional_id(self.namespace)),
                ) from None
            raise BrokerUnavailableError(f"writing the analytics results failed: {failed.reason}") from None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.abandon()
        self._group.close()


class ProgressPublisher:
    """The worker's receive progress snapshots (docs/analytics.md): per queue, each partition's
    committed offset, the completed offsets above it and the last stable offset."""

    def __init__(self, cluster: ClusterLike, namespace: str, counting: CountingClients):
        # counting: the process's shared counting clients (the queue groups' offsets readers and
        # the topics' listing, the queue watch's too); closed by their owner.
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        self._producer = clients.idempotent_producer(cluster)
        self._counting = counting

    def snapshot(self, queue: str, timeout: float) -> dict[str, Any] | None:
        """The queue group's committed offsets as they stand (a still-open transaction's are not
        there yet); None when the queue has no topic."""
        topic, group = names.queue_topic(self.namespace, queue), names.queue_group(self.namespace, queue)
        partitions = self._counting.partitions(topic, timeout)
        if partitions is None:
            return None
        try:
            committed = self._counting.committed(group, [TopicPartition(topic, p) for p in partitions], timeout)
        except KafkaException as exc:
            raise kafka_error(f"cannot list the committed offsets of {group}", exc.args[0]) from None
        rows = []
        for c in sorted(committed, key=lambda tp: tp.partition):
            pos = c.offset if c.error is None and c.offset >= 0 else None
            rows.append(
                {
                    "partition": c.partition,
                    "committed": pos,
                    "completed": sorted(decode_completed(pos, c.metadata)) if pos is not None else [],
                }
            )
        return {"queue": queue, "at": int(time.time() * 1000), "partitions": rows}

    def publish(self, snapshots: list[dict[str, Any]], timeout: float) -> None:
        topic = names.progress_topic(self.namespace)
        until = time.monotonic() + timeout
        for snap in snapshots:
            clients.produce(
                self._producer,
                topic,
                key=snap["queue"].encode(),
                value=orjson.dumps(snap),
                until=lambda: time.monotonic() >= until,
            )
        left = self._producer.flush(max(0.1, until - time.monotonic()))
        if left:
            raise kafka_error("publishing receive progress", KafkaError(KafkaError._TIMED_OUT))

    def close(self) -> None:
        self._producer.flush(2)


class ControlReader:
    """The worker's reading of the control topic from where it left off (every 2nd tick)."""

    def __init__(self, cluster: ClusterLike, namespace: str):
        self.topic = names.control_topic(namespace)
        self.rejects = Rejects(cluster, namespace, "control reader", record=False, scanned=True)
        self._consumer = reading_consumer(cluster, names.reader_group(namespace), **{"enable.partition.eof": False})
        self._assigned = False

    def read(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        """The commands given since the last read, (key, command) in order."""
        if not self._assigned:
            partitions = topic_partitions(self._consumer, self.topic, timeout)
            if partitions is None:
                return []
            self._consumer.assign([TopicPartition(self.topic, p, 0) for p in partitions])
            self._assigned = True
        out: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while True:
            msgs = self._consumer.consume(500, max(0.0, min(0.2, deadline - time.monotonic())))
            for msg in msgs:
                if msg.error() is None:
                    try:
                        out.append(control_command(msg.key(), msg.value()))
                    except Rejected as exc:  # skipped and logged; the worker's 5th-tick scan records it
                        self.rejects.reject(msg, exc.reason)
            if not msgs or time.monotonic() >= deadline:
                return out

    def close(self) -> None:
        self._consumer.close()
