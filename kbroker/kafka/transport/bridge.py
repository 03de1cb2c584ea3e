"""The bridge's pusher: moves what a namespace sent to queues on another cluster from its bridge
topic there, exactly once (core/transport/bridge.py says what the records are).

The instances of an endpoint that bridges to a cluster share the bridge topic's partitions as
one consumer group. For each partition it holds, a pusher has a transactional producer on the far
cluster whose id is the partition's: starting it fences the previous holder and ends the
transaction that one left open. Only then does it read the partition's position back from the
far cluster's positions topic (read_committed, to its end) and start reading the bridge topic
there. Each push is one far transaction: the messages, on their far queues, and the partition's
new position. A failed push whose outcome is unknown replaces the producer and reads the
position again: the far log, not a guess, says what went. The local group's offsets are
committed after each push, only so that the worker's reclaim can delete what was pushed.

A record that is not a bridge record, or whose far queue is not installed, is set aside in the
namespace's dead-letter topic (acknowledged before the push that passes it commits: a crash in
between sets it aside twice, never loses it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.records import Record
from kbroker.core.transport.bridge import (
    far_record,
    from_bridge,
    parse_position,
    position_key,
    position_record,
    positions_topic,
)
from kbroker.core.txn.faults import Deadline
from kbroker.kafka import clients, messages
from kbroker.kafka.catalog.apply import sync_topics
from kbroker.kafka.catalog.topic_specs import TopicSpec
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import topic_partitions
from kbroker.kafka.steps import FailureSink, LoggedOnce, run_steps
from kbroker.kafka.txn.guarded import GuardedProducer, TransactionFailed, service_producer, transact

log = logging.getLogger("kbroker.transport.bridge")
COMPONENT = "transport bridge"
PUSH_SECONDS = 10.0  # kbroker's own deadline on one push
BATCH = 500  # records pushed in one far transaction at most


def positions_spec(ns: str) -> TopicSpec:
    """The far cluster's positions topic of the namespace's pushers: compacted, one partition."""
    config = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", "delete.retention.ms": "86400000"}
    return TopicSpec(positions_topic(ns), 1, config, "transport bridge positions", False)


def install_positions(far: ClusterLike, ns: str, timeout: float = 30.0) -> list[str]:
    """Create the positions topic on the far cluster where missing (the installer does)."""
    created, _updated, _retention = sync_topics(far, [positions_spec(ns)], timeout=timeout)
    return created


class BridgePusher:
    """Pushes one bridge topic (`topic`, this namespace's to the cluster `far`) to its far queues.

    Parameters
    ----------
    source: this cluster's id (Kafka's), in the positions' keys: two clusters' namespaces of one
        name bridging to one far cluster keep apart."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        topic: str,
        far: ClusterLike,
        *,
        guard: FailureSink | None = None,
        interval: float = 0.05,
    ):
        self.namespace, self.topic = namespace, topic
        self._local, self._far = Cluster.of(cluster), Cluster.of(far)
        self._guard: FailureSink = guard or LoggedOnce(log)
        self._interval = interval
        self._consumer: Consumer = clients.consumer(self._local, topic, **{"session.timeout.ms": 10_000})
        self._reading_refused = clients.reading_refused(self._local, "the transport bridge", topic, topic)
        self._positions = positions_topic(namespace)
        self._source = self._consumer.list_topics(topic, timeout=PUSH_SECONDS).cluster_id or "unknown"
        self._producers: dict[int, GuardedProducer] = {}
        self._pending: set[int] = set()  # assigned, position not read back yet
        self._next: dict[int, int] = {}  # per partition held: the next offset to push
        self._far_known: set[str] = set()
        self._far_lookup = clients.producer(self._far, **{"allow.auto.create.topics": False})
        self.rejects = Rejects(cluster, namespace, COMPONENT)
        self.pushed = 0
        self.set_aside = 0
        self.denied: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BridgePusher:
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._thread = threading.Thread(target=self._run, name="kbroker-bridge", daemon=True)
        self._thread.start()
        return self

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        consumer.pause(partitions)  # until the far side said where each stands (_resume)
        self._pending |= {p.partition for p in partitions}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            self._pending.discard(p.partition)
            self._next.pop(p.partition, None)
            producer = self._producers.pop(p.partition, None)
            if producer is not None:
                producer.abandon()  # the next holder's producer fences it in any case

    def _run(self) -> None:
        self.denied = run_steps(self.step, self._stop, COMPONENT, self._guard, log)

    # --- one step ----------------------------------------------------------------------------

    def step(self) -> None:
        """Resume the partitions whose position is read back, then push what came."""
        batch = clients.consume_soon(self._consumer, BATCH, self._interval if not self._pending else 0.0)
        waiting = set(self._pending)  # what came for these was read before their position: read again
        if waiting:
            self._resume()
        by_partition: dict[int, list[Any]] = defaultdict(list)
        for msg in messages.records(batch, lambda err: log.warning("bridge: %s", err), refused=self._reading_refused):
            by_partition[msg.partition() or 0].append(msg)
        for partition, msgs in sorted(by_partition.items()):
            if partition in self._producers and partition not in self._pending and partition not in waiting:
                try:
                    self._push(partition, msgs)
                except Exception:
                    # Read past here but not pushed: from the far position again, whatever failed.
                    self._consumer.pause([TopicPartition(self.topic, partition)])
                    self._pending.add(partition)
                    raise

    def _producer(self, partition: int) -> GuardedProducer:
        tid = f"{self.topic}.{self._source}.{partition}"  # the partition's: a new holder fences the last
        return service_producer(self._far, tid, PUSH_SECONDS)

    def _resume(self) -> None:
        """For each pending partition: fence the last holder, read its far position, read the
        bridge topic from there (assigned again with every partition's offset)."""
        pending = sorted(self._pending)
        for p in pending:
            if p not in self._producers:
                self._producers[p] = self._producer(p)
        positions = self._read_positions(pending)
        for p in pending:
            self._next[p] = positions.get(p, OFFSET_BEGINNING)
        offsets = [
            TopicPartition(self.topic, tp.partition, self._next.get(tp.partition, OFFSET_BEGINNING))
            for tp in self._consumer.assignment()
        ]
        self._consumer.assign(list(offsets))
        self._consumer.resume(list(offsets))  # a partition paused stays so when assigned again
        self._pending.clear()

    def _read_positions(self, partitions: list[int]) -> dict[int, int]:
        """The far positions of `partitions` (none: from the start), read to the topic's end."""
        keys = {position_key(self._source, self.topic, p): p for p in partitions}
        reader = clients.consumer(self._far, f"{self.topic}.positions")
        try:
            tp = TopicPartition(self._positions, 0)
            low, high = reader.get_watermark_offsets(tp, timeout=PUSH_SECONDS, cached=False)
            found: dict[int, int] = {}
            if high <= low:
                return found
            reader.assign([TopicPartition(self._positions, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + PUSH_SECONDS
            while True:
                for msg in reader.consume(500, 0.2):
                    key = msg.key()
                    if msg.error() is None and key is not None and key in keys:
                        n = parse_position(msg.value())
                        if n is not None:
                            found[keys[key]] = n
                pos = reader.position([tp])[0].offset
                if pos >= high:
                    return found
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the far positions topic {self._positions} was not read to its end")
        finally:
            reader.close()

    # --- pushing -----------------------------------------------------------------------------

    def _far_exists(self, topic: str) -> bool:
        if topic not in self._far_known:
            if topic_partitions(self._far_lookup, topic, PUSH_SECONDS, never_creates=True) is None:
                return False
            self._far_known.add(topic)
        return True

    def _push(self, partition: int, msgs: list[Any]) -> None:
        records: list[Record] = []
        aside = 0
        for msg in msgs:
            try:  # anyone who may write the topic may write anything: set aside, never pushed
                address, message = from_bridge(msg.value(), messages.raw_headers(msg))
                record = far_record(address, message)
            except (MalformedRecord, ValueError) as exc:
                aside += self.rejects.reject(msg, str(exc))
                continue
            if not self._far_exists(record[0]):
                aside += self.rejects.reject(msg, f"queue {address.local} is not installed on the far cluster")
                continue
            records.append(record)
        nxt = msgs[-1].offset() + 1
        records.append(position_record(self.namespace, self._source, self.topic, partition, nxt))
        try:
            transact(self._producers[partition], records, [], Deadline(PUSH_SECONDS), PUSH_SECONDS)
        except TransactionFailed:
            # Committed or not, the far positions will say: a new producer (ending whatever is
            # open) and the position read back before this partition is pushed again.
            producer = self._producers.pop(partition, None)
            if producer is not None:
                producer.abandon()
            raise
        self._next[partition] = nxt
        self.pushed += len(records) - 1
        self.set_aside += aside
        try:  # only for the reclaim: the far positions are the truth
            self._consumer.commit(offsets=[TopicPartition(self.topic, partition, nxt)], asynchronous=True)
        except KafkaException as exc:
            log.debug("bridge: committing %s[%d] locally: %s", self.topic, partition, exc)

    # --- the rest ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "pushed": self.pushed,
            "set_aside": self.set_aside,
            "partitions": sorted(self._producers),
            "pending": sorted(self._pending),
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PUSH_SECONDS + 5)
        try:
            self._consumer.close()
        except KafkaException as exc:
            log.warning("closing the bridge's consumer: %s", exc)
        for producer in self._producers.values():
            producer.abandon()
        self._producers.clear()
        self._far_lookup.flush(1.0)
        self.rejects.close()
