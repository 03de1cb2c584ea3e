"""How many messages wait on a queue, and in how many conversation groups: the counts behind
MessagesReady. Read from Kafka, not guessed from offsets.

Offsets alone overcount: transaction markers and aborted records take offsets. So the watcher
reads the queue from the group's committed offsets (skipping offsets completed above them, from
the commit metadata) to the end, counting records and distinct keys. It reads at most `scan_cap`
records per pass and estimates the rest from offsets; it reads nothing when neither committed
nor end offsets moved since the last pass; and while a deep backlog drains it counts groups only
every `deep_rescan` seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.receive.offsets import decode_completed
from kbroker.errors import KBrokerError, kafka_error
from kbroker.kafka import messages
from kbroker.kafka.activation.counting_clients import CountingClients
from kbroker.kafka.clients import consume_soon
from kbroker.kafka.snapshot import Unread, watermarks


@dataclass(frozen=True)
class QueueCounts:
    backlog: int  # ready messages
    ready_groups: int  # distinct conversation groups holding them (a lower bound when capped)
    received: int  # sum of committed offsets: grows whenever some RECEIVE commits
    exact: bool


class QueueWatcher:
    """One queue's counts. `clients`: the process's shared counting clients (the worker's); a
    watcher given none makes its own and closes them with itself."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        queue: str,
        *,
        scan_cap: int = 2000,
        deep_rescan: float = 5.0,
        clients: CountingClients | None = None,
    ):
        self.queue = queue
        self._deep_rescan, self._scanned_at = deep_rescan, 0.0
        self.topic = names.queue_topic(namespace, queue)
        self._group = names.queue_group(namespace, queue)  # the readers' group: its committed offsets
        self._scan_cap = scan_cap
        self._own = clients is None
        self._clients = CountingClients(cluster, namespace) if clients is None else clients
        self._tps: list[TopicPartition] = []
        self._last_key: tuple[object, ...] | None = None
        self._last: QueueCounts | None = None

    def counts(self, timeout: float = 10.0) -> QueueCounts:
        """The counts now; a Kafka failure raises a typed kbroker error (BrokerUnavailableError
        while the cluster or the group's coordinator does not answer)."""
        try:
            if not self._tps:
                partitions = self._clients.partitions(self.topic, timeout)
                if partitions is None:
                    raise KBrokerError(f"counting queue {self.queue}: its topic {self.topic} does not exist")
                self._tps = [TopicPartition(self.topic, p) for p in partitions]
            with self._clients.scanner() as consumer:
                return self._counts(consumer, timeout)
        except KafkaException as exc:
            raise kafka_error(f"counting queue {self.queue}", exc.args[0]) from None

    def _counts(self, consumer: Consumer, timeout: float) -> QueueCounts:
        committed = self._clients.committed(self._group, self._tps, timeout)
        unread = next((tp for tp in committed if isinstance(tp, Unread)), None)
        if unread is not None:
            raise KafkaException(unread.error)  # counted again on the next pass
        bases, metadata = {}, {}
        ends_by = time.monotonic() + timeout
        for tp in committed:
            # A queue created a moment ago may not be led yet: watermarks() asks again until then.
            low, high = watermarks(consumer, self.topic, tp.partition, ends_by)
            bases[tp.partition] = (max(tp.offset if tp.offset >= 0 else low, low), high)
            metadata[tp.partition] = tp.metadata
        key = tuple((p, b, h, metadata[p]) for p, (b, h) in sorted(bases.items()))
        if key == self._last_key and self._last is not None:
            return self._last
        received = sum(b for b, _ in bases.values())
        todo = {p for p, (b, h) in bases.items() if h > b}
        backlog, keys, exact = 0, set(), True
        upper = sum(h - b for b, h in bases.values())
        if (
            upper > 2 * self._scan_cap
            and self._last is not None
            and time.monotonic() - self._scanned_at < self._deep_rescan
        ):
            # A deep backlog moving: its groups were counted less than `deep_rescan` ago; between
            # counts, report the offsets' bound and spare a reader's share of the CPU.
            result = QueueCounts(upper, self._last.ready_groups, received, False)
            self._last_key, self._last = key, result
            return result
        self._scanned_at = time.monotonic()
        done = {p: decode_completed(b, metadata[p]) for p, (b, _) in bases.items()}
        if todo:
            consumer.assign([TopicPartition(self.topic, p, bases[p][0]) for p in todo])
            positions = {p: bases[p][0] for p in todo}
            deadline = time.monotonic() + timeout
            while todo and backlog < self._scan_cap and time.monotonic() < deadline:
                # consume() would wait its whole timeout unless the batch fills; partition EOF
                # arrives as a message, so a scan that reached the end returns at once.
                msgs = consume_soon(consumer, 500, 0.05)
                for m in msgs:
                    if m.topic() != self.topic:
                        continue  # the scanning consumer's last scan was of another queue
                    if m.error():
                        if messages.error_code(m) == KafkaError._PARTITION_EOF:
                            todo.discard(messages.partition(m))
                        continue
                    p, offset = messages.position(m)
                    positions[p] = offset + 1
                    if offset not in done[p]:
                        backlog += 1
                        keys.add(m.key())
            consumer.unassign()
            if todo:  # capped: what was not read counts by offsets (an upper bound)
                exact = False
                backlog += sum(max(0, bases[p][1] - positions[p]) for p in todo)
        result = QueueCounts(backlog, len(keys), received, exact)
        self._last_key, self._last = key, result
        return result

    def close(self) -> None:
        if self._own:
            self._clients.close()
