"""What every kbroker client process holds, whichever face it speaks (Service Broker's dialogs in
sdk/runtime.py, the NServiceBus transport in sdk/transport/runtime.py): one producer for
statements outside a transaction, one group committer for transactions, one receiver per queue
it reads, the dead-letter path of records that are not messages, and its view of the catalog.

The faces' facades (Broker, TransportEndpoint) keep only their statements; their transactions
talk to the runtime. Everything here starts on first use and stops in close()."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from kbroker.core.cluster import Cluster
from kbroker.core.records import Record
from kbroker.errors import SendFailedError
from kbroker.kafka import messages
from kbroker.kafka.clients import brokers_answering, idempotent_producer, produce_within
from kbroker.kafka.producer_failures import Deliveries
from kbroker.kafka.receive.dead_letters import DeadLetters
from kbroker.kafka.receive.receiver import QueueReceiver
from kbroker.kafka.txn.committer import ActiveTransactions, GroupCommitter
from kbroker.sdk.catalog_view import CatalogView


class ProcessRuntime:
    """One process's connection to one namespace. `transactional_ids`: the group committer's,
    when they must be known before it starts (Service Broker's conversation leases name them)."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        *,
        ack_timeout: float = 30.0,
        commit_interval: float = 0.005,
        transactional_ids: tuple[str, ...] = (),
    ):
        self.cluster, self.namespace = cluster, namespace
        self.ack_timeout, self._commit_interval = ack_timeout, commit_interval
        self._transactional_ids = transactional_ids
        brokers_answering(cluster, timeout=10)  # BrokerUnavailableError when none answers
        # Every record this producer is given reports here, statements' and the endpoint store's.
        self._deliveries = Deliveries()  # failed deliveries, until the next flush
        self.producer = idempotent_producer(cluster, on_delivery=self._deliveries)
        # In reader reports and conversation leases: unique even where pids repeat (containers).
        self.process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.active_transactions = ActiveTransactions()
        self.catalog = CatalogView(cluster, namespace)
        self.dead_letters = DeadLetters(namespace, lambda: self.committer)
        self._lock = threading.RLock()  # the committer and the receivers, created once each
        self._send = threading.Lock()  # statements outside a transaction: one produce-and-flush at a time
        self._committer: GroupCommitter | None = None
        self._receivers: dict[Hashable, QueueReceiver] = {}

    @property
    def committer(self) -> GroupCommitter:
        """The process's group committer, started on first use."""
        with self._lock:
            if self._committer is None:
                self._committer = GroupCommitter(
                    self.cluster,
                    self.namespace,
                    interval=self._commit_interval,
                    transactional_ids=self._transactional_ids,
                    active_transactions=self.active_transactions,
                ).start()
            return self._committer

    def receiver_for(self, key: Hashable, build: Callable[[], QueueReceiver]) -> QueueReceiver:
        """The receiver registered under `key`, built (and started) by `build` the first time."""
        with self._lock:
            r = self._receivers.get(key)
            if r is None:
                r = self._receivers[key] = build()
            return r

    def close_idle_receivers(self, idle_for: float) -> list[Hashable]:
        """Close the receivers nothing has read from for `idle_for` s and that hold nothing a
        transaction needs (QueueReceiver.retire_if_idle); the next RECEIVE of their queue builds
        a new one. Their keys. For a process whose readers come and go (the worker's activated
        readers): an idle receiver holds Kafka clients and its share of the queue's partitions."""
        # Asked outside the process's lock: a receiver's poll thread holds the receiver's lock
        # while it takes this one (a dead letter's first use of the committer). A RECEIVE that
        # finds a retired receiver before it is dropped here returns empty.
        retired = [(key, r) for key, r in self.receivers().items() if r.retire_if_idle(idle_for)]
        with self._lock:
            for key, r in retired:
                if self._receivers.get(key) is r:
                    del self._receivers[key]
        for _key, r in retired:  # a close waits for the consumer to leave its group
            r.close()
            self._receiver_closed(r)
        return [key for key, _r in retired]

    def receivers(self) -> dict[Hashable, QueueReceiver]:
        """The receivers running now, by key."""
        with self._lock:
            return dict(self._receivers)

    def dead_letter(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """On a poll thread: a record that is not a message goes to the dead-letter topic with its
        reason, its offset committed with it, without waiting (kafka/receive/dead_letters.py)."""
        self.dead_letters.submit(receiver, record, reason)

    # --- statements outside a transaction -----------------------------------------------------

    @contextmanager
    def acknowledged(self) -> Iterator[Callable[[Record], None]]:
        """Produce records with what this yields; on leaving, wait until Kafka acknowledged them
        (SendFailedError if it did not). One such block at a time in the process."""
        with self._send:
            yield self.produce
            self._flush()

    def produce(self, record: Record) -> None:
        """Hand one record to the producer (within ack_timeout when its queue is full)."""
        topic, key, value, headers = record
        produce_within(
            self.producer,
            topic,
            self.ack_timeout,
            key=key,
            value=value,
            headers=messages.wire_headers(headers),
            on_delivery=self._deliveries,
        )

    def _flush(self) -> None:
        remaining, failed = self._deliveries.flushed(
            self.producer, self.cluster, self.ack_timeout, "Kafka did not acknowledge a record"
        )
        if remaining or failed:
            reason = failed.str() if failed else f"{remaining} message(s) not acknowledged in time"
            raise SendFailedError(f"Kafka did not acknowledge: {reason}")

    # --- lifecycle ----------------------------------------------------------------------------

    def _receiver_closed(self, receiver: QueueReceiver) -> None:
        """Called by close() for each receiver it stopped."""

    def close(self) -> None:
        """Stop the receivers, the catalog watch and the committer (which commits what is
        pending), and flush the producer."""
        with self._lock:
            receivers, self._receivers = list(self._receivers.values()), {}
            for r in receivers:
                r.close()
                self._receiver_closed(r)
            self.catalog.close()
            if self._committer is not None:
                self._committer.close()
                self._committer = None
        self.producer.flush(self.ack_timeout)
