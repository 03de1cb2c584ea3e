"""The one writer of rejected records (core/rejected.py): every reader that skips a record hands
it here, and goes on.

`Rejects(cluster, namespace, reader).reject(record, reason)` logs one line (at most one per
position per process; at DEBUG for a `scanned` reader) and, when the Rejects records, produces the
record's dead letter and its RECORD_REJECTED event with an idempotent producer made on the first
rejection (a reader that never meets a bad record never has one). It never raises and never
waits for the broker: a dead letter that cannot be written (a principal without WRITE on the
dead-letter topic, a broker that is down) is logged, and the reader goes on regardless; the bad
record is skipped either way.

Who records. A record on a topic that a consumer group reads (timers, monitor events, ticks,
progress) is met by one process once: it records it. A topic that every process reads whole
would give one dead letter per process per start, so its readers are made with `record=False`
(they skip and log), and the worker that owns the cluster's 5th tick scans it (`scan`) and
records each bad record once:
- the catalog and the endpoints are read whole at each scan (the endpoints as often as their
  reclaim): a bad record still the last of its key is recorded, and tombstoned when its key holds
  no valid value, which supersedes it (no later scan counts it; readers meet it until compaction
  removes it);
  one that follows a valid value of its key is only recorded (rewriting the old value could undo
  a newer write racing with it), and the scanner remembers it. `kbroker apply`, the catalog's
  writer, writes again an object whose last record is bad and records that record itself;
- the readers', analytics and control topics (a report every 2 s per reader, results, commands)
  are scanned on from where the last scan ended: every bad record once, no tombstones (their
  retention drops them).
A new tick owner scans from the start again, so a bad record is recorded once per tick owner
(and, rarely, by both a scan and the apply that repairs it), never once per process.

Who says so. The Rejects that records a record logs it at WARNING. A reader of a scanned topic is
made `scanned` as well as `record=False`: it skips at DEBUG, since it meets the record again at
each read of the topic whole (a tombstoned one until compaction removes it, one that follows a
valid value of its key for good), and every CLI call warned anew of catalog records set aside
long ago. Every reader of the scanned topics (catalog, endpoints, readers, analytics, control) is
made so; the monitors view, whose topic no scan covers, still warns. Its count (`rejected`) stays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.rejected import Rejected, position, rejection_records
from kbroker.errors import BrokerUnavailableError
from kbroker.kafka import clients
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions

__all__ = ["Rejects", "scan"]

log = logging.getLogger("kbroker.rejects")

_SEEN_LIMIT = 10_000  # positions remembered per Rejects: its memory stays bounded


class Rejects:
    """A reader's way to set records aside (see the module docstring). Thread-safe."""

    def __init__(
        self, cluster: ClusterLike, namespace: str, reader: str, *, record: bool = True, scanned: bool = False
    ):
        self.cluster, self.namespace, self.reader, self.records = Cluster.of(cluster), namespace, reader, record
        # scanned (with record=False): the 5th-tick scan reports and records this topic's bad
        # records, so this reader's line is at DEBUG (the count stays).
        self._level = logging.DEBUG if scanned and not record else logging.WARNING
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._seen: set[tuple[str | None, int | None, int | None]] = set()
        self.rejected = 0  # records this Rejects set aside (counted once per position)

    def reject(self, record: Any, reason: str) -> bool:
        """Set the record aside (a ConsumedRecord: a confluent Message, or core/rejected.Consumed);
        False when this position was already (a re-read)."""
        where = (record.topic(), record.partition(), record.offset())
        with self._lock:
            if where in self._seen:
                return False
            if len(self._seen) >= _SEEN_LIMIT:
                self._seen.clear()
            self._seen.add(where)
            self.rejected += 1
        log.log(self._level, "%s: record %s set aside: %s", self.reader, position(record), reason)
        if self.records:
            self._write(record, reason)
        return True

    def _write(self, record: Any, reason: str) -> None:
        try:
            with self._lock:
                if self._producer is None:
                    self._producer = clients.idempotent_producer(self.cluster, **{"message.timeout.ms": 30_000})
                producer = self._producer
            for topic, key, value, headers in rejection_records(
                self.namespace, record, reason, self.reader, int(time.time() * 1000)
            ):
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    headers=headers,  # type: ignore[arg-type]
                    on_delivery=self._delivered,
                )
            producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.error("%s: the dead letter of %s was not written: %s", self.reader, position(record), exc)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            log.error("%s: a dead letter was not written to %s: %s", self.reader, msg.topic(), err)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for the dead letters written so far; how many are still unacknowledged."""
        producer = self._producer
        return 0 if producer is None else producer.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)


def scan(
    rejects: Rejects,
    topic: str,
    decode: Callable[[Any], object],
    *,
    starts: dict[int, int] | None = None,
    timeout: float = 60.0,
) -> dict[int, int]:
    """Set aside each record of `topic` that `decode` rejects (see the module docstring). Without
    `starts`, the topic is read whole, a partition at a time (a key's records are in one), and
    only a record still the last of its key counts, tombstoned when its key has no valid value
    before it: what is kept per key is its verdict, and the record only when it is bad, so memory
    is a partition's keys, not its values. With `starts` (partition -> first offset, {} at
    first), every record from there counts, and the scanner passes the returned positions next
    time. Run by one worker (the 5th tick)."""
    whole = starts is None
    consumer = reading_consumer(rejects.cluster, names.reader_group(rejects.namespace))
    tombstones: list[tuple[int, bytes]] = []
    last: dict[bytes | None, tuple[Any, str | None, bool]] = {}  # key -> (bad record, why, valid before)

    def note(msg: Any) -> None:
        try:
            decode(msg)
            reason = None
        except Rejected as exc:
            reason = exc.reason
        if not whole:
            if reason is not None:
                rejects.reject(msg, reason)
            return
        key, before = msg.key(), last.get(msg.key())
        if msg.value() is None:  # a tombstone: nothing of the key is left
            last.pop(key, None)
            return
        valid_before = before is not None and (before[1] is None or before[2])
        last[key] = (msg if reason is not None else None, reason, valid_before)

    def partition_read() -> None:  # whole: the partition's keys whose last record is bad
        for key, (msg, reason, valid_before) in last.items():
            if reason is not None and rejects.reject(msg, reason) and not valid_before and key is not None:
                tombstones.append((msg.partition(), key))
        last.clear()

    positions: dict[int, int] = dict(starts or {})
    try:
        partitions = topic_partitions(consumer, topic, timeout) or []
        for group in [[p] for p in partitions] if whole else [partitions] if partitions else []:
            read = read_partitions(consumer, topic, {p: positions.get(p, 0) for p in group}, timeout, on_record=note)
            if read.unfinished:
                raise BrokerUnavailableError(f"could not read {topic} to its end in {timeout} s")
            positions.update(read.positions)
            partition_read()
    finally:
        consumer.close()
    if tombstones:
        producer = clients.idempotent_producer(rejects.cluster)

        def refused(err: Any, msg: Any) -> None:  # e.g. no WRITE on the catalog: the record stays, recorded
            if err is not None:
                log.error(
                    "%s: the tombstone over a rejected record of %s was not written: %s", rejects.reader, topic, err
                )

        for partition, key in tombstones:
            producer.produce(topic, key=key, value=None, partition=partition, on_delivery=refused)
        if producer.flush(timeout):
            raise BrokerUnavailableError(f"tombstones of rejected records in {topic} not acknowledged in {timeout} s")
    rejects.flush(timeout)
    return positions
