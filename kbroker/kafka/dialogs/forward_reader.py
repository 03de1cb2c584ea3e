"""The endpoints topic read forward: from where this process left off up to the topic's current
end, each record handed to the endpoint cache, and reads shared by the threads that ask at once.

Apart from conversation_endpoints.py, which decides what a record means to the cache: this holds
the consumer, the positions it reached, and whether the last read reached the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Message

from kbroker.core import names
from kbroker.core.cluster import Cluster
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions


class ForwardReader:
    """Reads `topic` forward for a cache: `on_record(msg, now)` for each record read and
    `after(now)` once a read ends (`now`: time.time() when that read began)."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        topic: str,
        on_record: Callable[[Message, float], None],
        after: Callable[[float], None],
    ):
        self.topic = topic
        self._cluster = cluster
        self._namespace = namespace
        self._on_record = on_record
        self._after = after
        self._consumer: Consumer | None = None
        self._positions: dict[int, int] = {}
        self.behind = False  # the last read stopped at its deadline, short of the end
        self.read_at = float("-inf")  # time.monotonic() of the last read forward
        self._reading = threading.Lock()  # readers' threads and the poll threads share the consumer
        # Reads forward begun, and the number of the last one that ended without an error.
        self._reads_begun = self._read_ok = 0

    def read(self, timeout: float) -> None:
        """Read the topic forward: a caller needs a read begun after it called (what it wrote
        before is in it), so callers that queued behind one read share the next one instead
        of reading one after another (64 readers claiming or renewing leases at once queued
        64 reads)."""
        asked = self._reads_begun
        with self._reading:
            if self._read_ok > asked:
                return  # a read begun after this call ended meanwhile, and did not fail
            self._reads_begun += 1
            this = self._reads_begun
            self._read_locked(timeout)
            self._read_ok = this

    def _read_locked(self, timeout: float) -> None:
        """Read the topic from where this process left off up to its current end. A Kafka error
        raises a typed kbroker error (BrokerUnavailableError when trying later may help); what
        was not reached by the deadline is read by the next call."""
        if self._consumer is None:
            self._consumer = reading_consumer(self._cluster, names.reader_group(self._namespace))
        if not self._positions:
            partitions = topic_partitions(self._consumer, self.topic, timeout)
            if partitions is None:
                return  # no endpoint yet: asked again on the next read
            self._positions = dict.fromkeys(partitions, 0)
        now = time.time()
        read = read_partitions(
            self._consumer, self.topic, self._positions, timeout, on_record=lambda msg: self._on_record(msg, now)
        )
        self._positions.update(read.positions)
        self.behind = bool(read.unfinished)
        self.read_at = time.monotonic()
        self._after(now)

    def close(self) -> None:
        """Close the reading consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
