"""The transport face's process runtime: the shared one (sdk/process.py) plus what an endpoint
instance's transactions and readers need of it: its settings, the queue directory that maps
transport queues to topics, the failed-delivery counts (MaxRetries), its counters, and the
poison path to the dead-letter topic.

TransportEndpoint (the statements a user calls) and TransportTransaction both work through it."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Mapping

from kbroker.core.cluster import Cluster
from kbroker.core.records import Record
from kbroker.core.transport.endpoint import FailedDeliveries, TransportSettings
from kbroker.core.transport.message import new_message, to_headers
from kbroker.errors import InvalidArgumentError
from kbroker.kafka.receive.receiver import Lease, QueueReceiver
from kbroker.kafka.transport.queues import MAX_BODY_BYTES, QueueDirectory, transport_receiver
from kbroker.sdk.process import ProcessRuntime

log = logging.getLogger("kbroker.transport")


class TransportRuntime(ProcessRuntime):
    """The runtime of one transport endpoint instance."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        settings: TransportSettings,
        *,
        ack_timeout: float = 30.0,
        commit_interval: float = 0.005,
        max_buffered: int = 20_000,
    ):
        super().__init__(cluster, namespace, ack_timeout=ack_timeout, commit_interval=commit_interval)
        self.settings = settings
        self._max_buffered = max_buffered
        self.queues = QueueDirectory(namespace, self.producer)
        self.failures = FailedDeliveries()
        self.counters: Counter[str] = Counter()
        self._counting = threading.Lock()
        self._closing = False

    def receiver(self, queue: str) -> QueueReceiver:
        """The process's receiver of a transport queue (one consumer per queue)."""

        def build() -> QueueReceiver:
            topic = self.queues.topic(queue)  # TransportQueueNotFoundError before any consumer joins
            return transport_receiver(
                self.cluster,
                self.namespace,
                queue,
                topic,
                dead_letter=self._dead_letter_malformed,
                commit_barrier=self.committer.barrier,
                max_buffered=self._max_buffered,
                committer_ids=self.committer.transactional_ids,
            )

        return self.receiver_for(queue, build)

    def closing(self) -> bool:
        """Whether the endpoint is closing: a waiting receive gives up."""
        return self._closing

    def count(self, what: str, n: int = 1) -> None:
        """Add `n` to one of the endpoint's counters (received, committed, expired, ...)."""
        with self._counting:
            self.counters[what] += n

    def record(
        self,
        destination: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        *,
        correlation_id: str | None,
        reply_to_address: str | None,
        recoverable: bool,
        time_to_be_received: float | None,
        message_id: str | None,
    ) -> Record:
        """The record of a send to `destination` (its queue must exist). `reply_to_address`:
        None for this instance's reply queue, "" for none."""
        topic = self.queues.topic(destination)
        if body is not None and len(body) > MAX_BODY_BYTES:  # refused now: at commit it would fail every time
            raise InvalidArgumentError(
                f"the body is {len(body):,} bytes; a transport queue takes at most {MAX_BODY_BYTES:,}"
            )
        reply_to = self.settings.reply_address if reply_to_address is None else reply_to_address or None
        try:
            msg = new_message(
                body,
                headers,
                now_ms=int(time.time() * 1000),
                message_id=message_id,
                correlation_id=correlation_id,
                reply_to_address=reply_to,
                recoverable=recoverable,
                time_to_be_received=time_to_be_received,
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return (topic, msg.id.encode(), msg.body, to_headers(msg))

    def _dead_letter_malformed(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """On the poll thread: a record that is not a transport message goes to the dead-letter
        topic with its reason, its offset committed with it; the queue goes on."""
        self.count("dead_lettered")
        self.dead_letter(receiver, record, reason)

    def dead_letter_poison(self, lease: Lease, record: Any, reason: str) -> None:
        """A poison message: moved to the dead-letter topic (set aside if Kafka refuses the
        copy, kafka/receive/dead_letters.py), committed before returning."""
        log.warning(
            "message at %s[%s]@%s moved to the dead-letter topic: %s",
            lease.receiver.topic,
            record.partition(),
            record.offset(),
            reason,
        )
        try:
            self.dead_letters.commit(lease, record, reason)
        finally:
            lease.receiver.release(lease, True)
        self.count("dead_lettered")

    def close(self) -> None:
        """Give up waiting receives, stop reading, commit what is pending and flush."""
        self._closing = True
        super().close()
