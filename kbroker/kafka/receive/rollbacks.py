"""Rolled-back receives, counted per message across processes (core/receive/poison.RollbackLedger).

A process that rolls back a RECEIVE puts a RECEIVE_ROLLED_BACK event on the namespace's events
topic (key: the queue) naming each message it had taken and that message's rollback count. Every
reading process follows the events topic from a few minutes back, so when a message moves to
another reader (a rebalance, a dead process) its count goes on from where it was. An operator
sees the same events (`kbroker events`, the dashboards). The same reading follows the poison
verdicts that only the events topic carries (core/receive/poison.EventDisables): `disabled(queue)`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.receive.poison import EventDisables, Position, RollbackLedger
from kbroker.errors import PermissionDeniedError
from kbroker.kafka import clients
from kbroker.kafka.background import Background
from kbroker.kafka.snapshot import CONSUME_WAIT, read_partitions, reading_consumer, topic_partitions

log = logging.getLogger("kbroker.poison")

ROLLED_BACK = "RECEIVE_ROLLED_BACK"
_ROLLED_BACK_JSON = f'"{ROLLED_BACK}"'.encode()  # how a rollback event's bytes say so
_QUEUE_STATUS_JSON = b'"QUEUE_'  # QUEUE_DISABLED, QUEUE_ENABLED (kafka/queue_views.py)
LOOKBACK_SECONDS = 600.0  # a poison message is retried within seconds; ten minutes is plenty


def rollback_event(value: bytes | None) -> tuple[str, str, list[tuple[int, int, int]]] | None:
    """A RECEIVE_ROLLED_BACK event's (queue, topic, [(partition, offset, count)]); None for any
    other event, or one not well formed (anyone may write the events topic)."""
    if not value or _ROLLED_BACK_JSON not in value:
        return None  # other events: passed without parsing
    try:
        event = orjson.loads(value)
        return (
            str(event["queue"]),
            str(event["topic"]),
            [(int(p), int(o), int(count)) for p, o, count in event["messages"]],
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def recent_starts(consumer: Any, topic: str, since_s: float, timeout: float) -> dict[int, int] | None:
    """partition -> the first offset of `topic` written in the last `since_s` seconds, OFFSET_END
    (-1) for a partition with nothing since; None when the topic does not exist."""
    partitions = topic_partitions(consumer, topic, timeout)
    if not partitions:
        return None
    when = int((time.time() - since_s) * 1000)
    starts = consumer.offsets_for_times([TopicPartition(topic, p, when) for p in partitions], timeout=timeout)
    return {tp.partition: tp.offset for tp in starts}


class RollbackLog(Background):
    """This process's view of every process's rollbacks, and where it publishes its own."""

    thread_name = "kbroker-rollbacks"

    def __init__(self, cluster: ClusterLike, namespace: str, producer: Producer, process: str):
        super().__init__()
        self._cluster, self._namespace, self._producer = Cluster.of(cluster), namespace, producer
        self._process = process
        self.ledger = RollbackLedger()
        self._disables = EventDisables()
        self._waited = False  # disabled() waited for the recent events once
        self._lock = threading.Lock()
        self._caught_up = threading.Event()  # the others' recent rollbacks have been read
        self._pending: set[int] = set()  # partitions not yet read to where they ended at start

    def rolled_back(self, queue: str, topic: str, offsets: Iterable[tuple[int, int]]) -> dict[Position, int]:
        """Count one rollback of each message (partition, offset) of `topic` and publish the
        counts (fire and forget: a count that does not reach Kafka is only a count). The
        first rollback waits up to a second for the others' recent rollbacks to be read."""
        positions = [(topic, p, o) for p, o in offsets]
        if not positions:
            return {}
        self._caught_up.wait(1.0)
        with self._lock:
            counts = self.ledger.rolled_back(positions)
        event = {
            "event": ROLLED_BACK,
            "queue": queue,
            "topic": topic,
            "process": self._process,
            "messages": [[p, o, counts[(topic, p, o)]] for _, p, o in positions],
            "time": int(time.time() * 1000),
        }
        try:
            self._producer.produce(names.events_topic(self._namespace), key=queue.encode(), value=orjson.dumps(event))
            self._producer.poll(0)
        except (BufferError, KafkaException) as exc:
            log.warning("rollback of %s not published: %s", queue, exc)
        return counts

    def publish_disabled(self, queue: str, reason: str) -> None:
        """A poison verdict this process cannot write to the catalog: every reader's, from the
        events topic (core/receive/poison.EventDisables); this process's at once."""
        event = {
            "event": "QUEUE_DISABLED",
            "queue": queue,
            "reason": reason,
            "poison": True,
            "catalog": False,
            "process": self._process,
            "time": int(time.time() * 1000),
        }
        with self._lock:
            self._disables.seen(event)
        try:
            self._producer.produce(names.events_topic(self._namespace), key=queue.encode(), value=orjson.dumps(event))
            self._producer.poll(0)
        except (BufferError, KafkaException) as exc:
            log.warning("the disabling of %s not published: %s", queue, exc)

    def disabled(self, queue: str) -> bool:
        """Whether a poison verdict outside the catalog holds `queue` disabled (a process that
        just began following waits once, up to a second, to have read the recent events)."""
        if not self._waited:
            self._caught_up.wait(1.0)
            self._waited = True
        with self._lock:
            return self._disables.disabled(queue)

    def committed(self, topic: str, offsets: Iterable[tuple[int, int]]) -> None:
        """The messages were received by a committed transaction: forget their counts."""
        with self._lock:
            self.ledger.forget((topic, p, o) for p, o in offsets)

    def _run(self) -> None:
        topic = names.events_topic(self._namespace)
        consumer = reading_consumer(
            self._cluster, names.reader_group(self._namespace), **{"allow.auto.create.topics": False}
        )
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    if not consumer.assignment():
                        self._assign_recent(consumer, topic)
                        if not consumer.assignment():
                            self._caught_up.set()  # no events topic: nothing to catch up on
                            self._stop.wait(1.0)
                            continue
                    self._read(clients.consume_soon(consumer, 500, CONSUME_WAIT))
                    failing = False
                except PermissionDeniedError as exc:  # no RECEIVE's READ on the events topic: it stays so
                    # The RECEIVE that started it is refused too and says so; this only explains
                    # a poison count that misses other processes' rollbacks.
                    log.info("rollbacks of other processes not followed: %s", exc)
                    self._caught_up.set()
                    return
                except KafkaException as exc:
                    if not failing:
                        log.warning("following rollbacks on %s paused: %s", topic, exc)
                    failing = True
                    self._stop.wait(1.0)
        finally:
            consumer.close()

    def _assign_recent(self, consumer: Consumer, topic: str) -> None:
        starts = recent_starts(consumer, topic, LOOKBACK_SECONDS, 5.0)
        if starts is None:
            return
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])  # -1: at its end
        self._pending = {p for p, offset in starts.items() if offset >= 0}
        if not self._pending:
            self._caught_up.set()

    def _read(self, records: list[Message]) -> None:
        for msg in records:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._pending.discard(msg.partition())
                    if not self._pending:
                        self._caught_up.set()
                continue
            value = msg.value()
            if value and _QUEUE_STATUS_JSON in value:
                try:
                    with self._lock:
                        self._disables.seen(orjson.loads(value))
                except orjson.JSONDecodeError:
                    pass
                continue
            event = rollback_event(value)
            if event is not None:
                _, topic, counts = event
                with self._lock:
                    for p, o, count in counts:
                        self.ledger.seen((topic, p, o), count)


def recent_rollbacks(
    cluster: ClusterLike, namespace: str, timeout: float = 10.0, since_s: float = LOOKBACK_SECONDS
) -> dict[str, dict[tuple[int, int], int]]:
    """queue -> (partition, offset) -> the highest rollback count the events topic says of each
    message rolled back in the last `since_s` seconds (for `kbroker diagnose runtime`)."""
    topic = names.events_topic(namespace)
    consumer = reading_consumer(cluster, names.reader_group(namespace), **{"allow.auto.create.topics": False})
    counts: dict[str, dict[tuple[int, int], int]] = {}

    def take(msg: Any) -> None:
        event = rollback_event(msg.value())
        if event is not None:
            queue, _, messages = event
            seen = counts.setdefault(queue, {})
            for p, o, count in messages:
                seen[(p, o)] = max(seen.get((p, o), 0), count)

    try:
        starts = {p: o for p, o in (recent_starts(consumer, topic, since_s, timeout) or {}).items() if o >= 0}
        if starts:
            read_partitions(consumer, topic, starts, timeout, on_record=take)
    except KafkaException as exc:
        raise clients.kafka_error(f"cannot read the rollbacks on {topic}", exc.args[0]) from None
    finally:
        consumer.close()
    return {q: c for q, c in counts.items() if c}
