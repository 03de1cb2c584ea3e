"""The Kafka clients a process counts many queues with (the worker's queue watch and receive
progress), shared so that a namespace of N queues costs about N clients, not 2N plus one per
count in flight.

Why it matters: confluent-kafka takes one of the process's 1,024 thread-local keys per client,
so one process holds about 1,000 clients at most ("Failed to initialize thread local storage"
past that). A worker that kept a consumer per watched queue and an offsets reader per queue for
the progress snapshots ran out at 500 queues, and its activations failed.

Not an admin client for every group's offsets: librdkafka's admin requests for group offsets
abort or crash the process when a coordinator goes away (see reader.group_offsets; an
assertion in rd_kafka_enq_once_del_source_return within 10 s of a broker outage, here). So one
offsets reader per group (a consumer of the group's id that never subscribes), and a pool of
reading consumers for the scans, one per thread that scans at once. And one listing of the
topics' partitions for every queue: a metadata request per queue and pass cost a worker of 500
queues 42 s a round.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.errors import kafka_error
from kbroker.kafka.snapshot import group_offsets, offsets_reader, reading_consumer, topic_partitions

# Seconds a listing of the topics' partitions is trusted: a queue's topic gains partitions only
# when an operator alters it, and such partitions are counted this late.
TOPICS_FOR = 10.0


class CountingClients:
    """Offsets readers by group, and scanning consumers lent one per caller. Thread-safe."""

    def __init__(self, cluster: ClusterLike, namespace: str):
        self._cluster, self._namespace = cluster, namespace
        self._readers: dict[str, Consumer] = {}
        self._idle: queue.SimpleQueue[Consumer] = queue.SimpleQueue()
        self._made: list[Consumer] = []
        self._lock = threading.Lock()
        self._closed = False
        self._topics: dict[str, list[int]] = {}  # every topic's partitions, as last listed
        self._listed_at = float("-inf")
        self._listing = threading.Lock()

    def partitions(self, topic: str, timeout: float) -> list[int] | None:
        """`topic`'s partitions from one listing of every topic, kept TOPICS_FOR seconds; a topic
        not in it (new, or hidden from a listing of all) is asked for by name; None when it does
        not exist."""
        with self._listing:
            if time.monotonic() - self._listed_at >= TOPICS_FOR:
                with self.scanner() as consumer:
                    try:
                        listed = consumer.list_topics(timeout=timeout).topics
                    except KafkaException as exc:
                        raise kafka_error("cannot read topic metadata", exc.args[0]) from None
                self._topics = {t: sorted(m.partitions) for t, m in listed.items() if m.error is None}
                self._listed_at = time.monotonic()
            known = self._topics.get(topic)
        if known is not None:
            return known
        with self.scanner() as consumer:
            return topic_partitions(consumer, topic, timeout)

    def committed(self, group: str, partitions: list[TopicPartition], seconds: float) -> list[TopicPartition]:
        """`group`'s committed offsets of `partitions` as they stand (a still-open transaction's
        are not there yet), through the group's one reader (reader.group_offsets)."""
        with self._lock:
            self._check_open()
            reader = self._readers.get(group)
            if reader is None:
                reader = self._readers[group] = offsets_reader(self._cluster, group, stable=False)
        return group_offsets(reader, partitions, seconds)

    @contextmanager
    def scanner(self) -> Iterator[Consumer]:
        """A reading consumer (partition EOF reported) for one scan; unassigned when given back."""
        try:
            consumer = self._idle.get_nowait()
        except queue.Empty:
            with self._lock:
                self._check_open()
                consumer = reading_consumer(self._cluster, names.reader_group(self._namespace))
                self._made.append(consumer)
        try:
            yield consumer
        finally:
            try:
                consumer.unassign()
            except KafkaException:
                pass  # a consumer left assigned is assigned afresh by its next scan
            self._idle.put(consumer)

    @property
    def clients(self) -> int:
        """How many clients this holds (the readers and the scanners made so far)."""
        with self._lock:
            return len(self._readers) + len(self._made)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the counting clients are closed")

    def close(self) -> None:
        """Close every client (after the threads that use them stopped)."""
        with self._lock:
            self._closed = True
            for client in [*self._readers.values(), *self._made]:
                client.close()
            self._readers.clear()
            self._made.clear()
            self._idle = queue.SimpleQueue()
