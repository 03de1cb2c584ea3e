"""RECEIVE on one queue: a consumer in the queue's group, records buffered per conversation group.

A RECEIVE takes the ready group with the highest priority (oldest first among equals) and returns
up to TOP(n) of its messages in order. Offsets complete out of order (PartitionOffsets), and the
completed offsets above the committed one travel in the commit metadata. Memory is bounded:
past `max_buffered` records the consumer pauses its partitions until RECEIVEs drain the buffer.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message as KafkaRecord, TopicPartition

from . import names
from .config import KAFKA_LOG
from .envelope import Envelope, MalformedRecord, Message
from .endpoints import handle_for
from .offsets import PartitionOffsets

log = logging.getLogger("kbroker.receiver")


@dataclass
class Buffered:
    envelope: Envelope
    record: KafkaRecord


class QueueReader:
    def __init__(self, bootstrap: str, namespace: str, queue: str, *,
                 dead_letter: Callable[[KafkaRecord, str], None], max_buffered: int = 10_000,
                 consumer_config: dict | None = None):
        self.queue = queue
        self.topic = names.queue_topic(namespace, queue)
        self._dead_letter = dead_letter
        self._max_buffered = max_buffered
        self._groups: OrderedDict[str, deque[Buffered]] = OrderedDict()
        self._buffered = 0
        self._paused = False
        self._offsets: dict[int, PartitionOffsets] = {}
        self._eof: set[int] = set()
        self._dirty: set[int] = set()
        conf = {
            "bootstrap.servers": bootstrap,
            "logger": KAFKA_LOG,
            "group.id": names.queue_group(namespace, queue),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "partition.assignment.strategy": "cooperative-sticky",
        }
        conf.update(consumer_config or {})
        self._consumer = Consumer(conf)
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)

    # --- rebalance --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = consumer.committed(partitions, timeout=30)
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else 0
            self._offsets[tp.partition] = PartitionOffsets(start, tp.metadata)
            self._eof.discard(tp.partition)
        consumer.incremental_assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        # Nothing handed out is in flight (RECEIVE here commits before it returns), so the
        # buffered records of a revoked partition are simply dropped; the new owner reads them.
        for group in list(self._groups):
            queue = self._groups[group]
            kept = deque(b for b in queue if b.record.partition() not in revoked)
            self._buffered -= len(queue) - len(kept)
            if kept:
                self._groups[group] = kept
            else:
                del self._groups[group]
        for p in revoked:
            self._offsets.pop(p, None)
            self._eof.discard(p)
            self._dirty.discard(p)
        consumer.incremental_unassign(partitions)

    # --- fetching ---------------------------------------------------------------------------

    def _caught_up(self) -> bool:
        return bool(self._offsets) and self._eof >= set(self._offsets)

    def _poll(self, timeout: float) -> None:
        for rec in self._consumer.consume(500, timeout):
            err = rec.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._eof.add(rec.partition())
                    continue
                if err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                    log.warning("consumer error on %s: %s", self.topic, err)
                    continue
                raise KafkaException(err)
            self._accept(rec)
        self._apply_backpressure()

    def _accept(self, rec: KafkaRecord) -> None:
        p, off = rec.partition(), rec.offset()
        tracker = self._offsets.get(p)
        if tracker is None:
            return  # a late record of a partition already revoked
        self._eof.discard(p)
        if tracker.already_done(off):
            tracker.fetched(off)
            return
        tracker.fetched(off)
        try:
            env = Envelope.from_headers(rec.headers())
            if rec.key() is None or rec.key().decode() != env.conversation_group_id:
                raise MalformedRecord("record key does not match the conversation group header")
        except (MalformedRecord, UnicodeDecodeError) as exc:
            self._dead_letter(rec, str(exc))
            self._complete(p, off)
            return
        self._groups.setdefault(env.conversation_group_id, deque()).append(Buffered(env, rec))
        self._buffered += 1

    def _apply_backpressure(self) -> None:
        if not self._paused and self._buffered >= self._max_buffered:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
        elif self._paused and self._buffered <= self._max_buffered // 2:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False

    # --- RECEIVE ----------------------------------------------------------------------------

    def _pick(self, group_filter: str | None, conversation_filter: str | None) -> str | None:
        best, best_key = None, None
        for group, queue in self._groups.items():
            if group_filter is not None and group != group_filter:
                continue
            if conversation_filter is not None and not any(
                    b.envelope.conversation_id == conversation_filter for b in queue):
                continue
            head = queue[0]
            key = (-head.envelope.priority, head.record.timestamp()[1], head.record.offset())
            if best_key is None or key < best_key:
                best, best_key = group, key
        return best

    def receive(self, top: int, wait: float | None, *, conversation_group: str | None = None,
                conversation_id: str | None = None, now_ms: Callable[[], int] | None = None) -> list[Message]:
        """Messages of one conversation group, in order. wait=0: what is there now;
        wait=None: block until something arrives (WAITFOR without TIMEOUT)."""
        now_ms = now_ms or (lambda: int(time.time() * 1000))
        start = time.monotonic()
        deadline = None if wait is None else start + wait
        # "Nothing there" is only said once the consumer has read to the end of its partitions;
        # a reader that has just joined its group needs a moment before it can say so.
        catch_up_deadline = start + max(wait or 0.0, 30.0)
        while True:
            group = self._pick(conversation_group, conversation_id)
            if group is not None:
                out = self._take(group, top, conversation_id, now_ms())
                if out:
                    return out
                continue  # everything taken had expired; look again
            now = time.monotonic()
            if deadline is not None and now >= deadline and (self._caught_up() or now >= catch_up_deadline):
                return []
            left = 0.5 if deadline is None else deadline - now
            self._poll(min(max(left, 0.05), 0.5))

    def _take(self, group: str, top: int, conversation_id: str | None, now: int) -> list[Message]:
        queue = self._groups[group]
        out: list[Message] = []
        kept: deque[Buffered] = deque()
        while queue and len(out) < top:
            b = queue.popleft()
            if conversation_id is not None and b.envelope.conversation_id != conversation_id:
                kept.append(b)
                continue
            self._buffered -= 1
            self._complete(b.record.partition(), b.record.offset())
            if b.envelope.expires is not None and b.envelope.expires <= now:
                continue  # time-to-be-received passed: never delivered
            out.append(self._to_message(b))
        kept.extend(queue)
        if kept:
            self._groups[group] = kept
        else:
            del self._groups[group]
        return out

    def _to_message(self, b: Buffered) -> Message:
        env, rec = b.envelope, b.record
        return Message(
            queue=self.queue,
            conversation_handle=handle_for(env.conversation_id, env.to_side),
            conversation_id=env.conversation_id,
            conversation_group_id=env.conversation_group_id,
            message_sequence_number=env.message_sequence_number,
            message_type_name=env.message_type_name,
            service_name=env.to_service_name,
            service_contract_name=env.service_contract_name,
            message_id=env.message_id,
            body=rec.value() or b"",
            priority=env.priority,
            correlation_id=env.correlation_id,
            reply_to=env.reply_to,
            expires=env.expires,
            enqueued_time=rec.timestamp()[1],
            partition=rec.partition(),
            offset=rec.offset(),
            extra={"envelope": env},
        )

    # --- commit -----------------------------------------------------------------------------

    def _complete(self, partition: int, offset: int) -> None:
        tracker = self._offsets.get(partition)
        if tracker is not None:
            tracker.complete(offset)
            self._dirty.add(partition)

    def commit(self) -> None:
        """Commit every partition whose completion changed, synchronously."""
        if not self._dirty:
            return
        tps = []
        for p in sorted(self._dirty):
            tracker = self._offsets.get(p)
            if tracker is None:
                continue
            pos, meta = tracker.commit_position()
            tps.append(TopicPartition(self.topic, p, pos, metadata=meta))
        if tps:
            self._consumer.commit(offsets=tps, asynchronous=False)
        self._dirty.clear()

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._consumer.close()
