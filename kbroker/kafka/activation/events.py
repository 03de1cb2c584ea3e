"""A namespace's events topic read by a consumer group member (the external activator): records
in, with the consumer, its offsets and Kafka's errors kept here."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.errors import BrokerUnavailableError, CatalogError
from kbroker.kafka import clients
from kbroker.kafka.clients import kafka_error
from kbroker.kafka.snapshot import without_errors

POSITION_BUDGET = 30.0  # seconds the assignment callback keeps asking for the start positions


@dataclass(frozen=True)
class EventRecord:
    """One record of the events topic (key: the queue; value: the event as JSON)."""

    key: bytes | None
    value: bytes | None


class EventsReader:
    """Reads the namespace's events topic as a member of `group`, committing only when told.

    On first start (no committed offset) a partition is read from its end as of the assignment,
    and that position is committed at once; `on_ready` is called once the assigned partitions
    are positioned, so an event written after it is never skipped. Kafka errors that do not stop
    the reading are reported to `on_error` as text."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        group: str,
        *,
        on_ready: Callable[[], None] = lambda: None,
        on_error: Callable[[str], None] = lambda _text: None,
    ):
        """Raises BrokerUnavailableError when no broker answers, CatalogError when the topic
        does not exist."""
        self.topic = names.events_topic(namespace)
        self._on_ready, self._on_error = on_ready, on_error
        self._consumer = clients.consumer(
            cluster,
            group,
            **{"auto.offset.reset": "latest", "session.timeout.ms": 10_000, "partition.assignment.strategy": "range"},
        )
        try:
            meta = self._consumer.list_topics(self.topic, timeout=10)
        except KafkaException as exc:
            self._consumer.close()
            raise BrokerUnavailableError(f"no Kafka broker answers at {cluster}: {exc}") from None
        t = meta.topics.get(self.topic)
        if t is None or t.error is not None:
            self._consumer.close()
            raise CatalogError(
                f"topic {self.topic} does not exist: run 'kbroker apply' for namespace {namespace!r} first"
            )

    def subscribe(self) -> None:
        """Join the group; partitions arrive (and `on_ready` is called) during `read`."""
        self._consumer.subscribe([self.topic], on_assign=self._on_assign)

    def read(self, max_records: int, timeout: float) -> list[EventRecord]:
        """Up to `max_records` records, waiting up to `timeout` seconds."""
        out = []
        for msg in clients.consume_soon(self._consumer, max_records, timeout):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self._on_error(str(err))
                continue
            out.append(EventRecord(msg.key(), msg.value()))
        return out

    def commit(self) -> None:
        """Commit the positions of what `read` returned, without waiting for the answer (`close`
        makes the last one stick); raises a typed kbroker error."""
        try:
            self._consumer.commit(asynchronous=True)
        except KafkaException as exc:
            raise kafka_error(f"committing the position on {self.topic}", exc.args[0]) from None

    def close(self) -> None:
        """Make the last position stick, then leave the group. Never raises: whoever stops the
        reader has more important things to finish."""
        try:
            # The asynchronous commits may still be in flight: a restart then does not replay
            # (and act on) what was handled already.
            self._consumer.commit(asynchronous=False)
        except KafkaException:
            pass  # nothing read since the last commit (_NO_OFFSET), or no broker
        try:
            self._consumer.close()
        except Exception:  # noqa: BLE001 - leaving the group cleanly is a courtesy, not a duty
            pass

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # "Latest on first start" resolved here, not lazily by auto.offset.reset: the position is
        # fixed (and committed) before `on_ready`, so an event written after it is never
        # skipped, and a restart resumes where this run began rather than at a new "latest".
        # A busy or just-started broker can fail a question (the group coordinator still
        # loading): ask again, for up to POSITION_BUDGET s, rather than fall back at once to a
        # lazy "latest", which skipped the events written between `on_ready` and the first fetch.
        deadline = time.monotonic() + POSITION_BUDGET
        while True:
            try:
                self._position(consumer, partitions)
                break
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    self._on_error(f"positioning on assignment: {exc}; reading from the end as of the first fetch")
                    consumer.assign(partitions)  # auto.offset.reset=latest still applies
                    break
                time.sleep(0.5)
        self._on_ready()

    @staticmethod
    def _position(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # An unstable offset (a transaction holding it) is a failed answer, not "none committed".
        positioned = without_errors(consumer.committed(partitions, timeout=10))
        fresh = []
        for tp in positioned:
            if tp.offset < 0:
                tp.offset = consumer.get_watermark_offsets(tp, timeout=10)[1]
                fresh.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        if fresh:
            consumer.commit(offsets=fresh, asynchronous=False)
        consumer.assign(positioned)
