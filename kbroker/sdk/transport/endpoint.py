"""The transport face: endpoints that exchange transport messages the way NServiceBus's SQL
Server transport does (seed 002), over kbroker's Kafka machinery. No dialogs: a send INSERTs a
message into a queue, a receive takes the oldest one any instance has not taken.

    ep = kbroker.transport.endpoint("Sales", install=True)     # queues Sales and Sales.<machine>
    ep.send("Billing", b'{"order": 1}', {"NServiceBus.EnclosedMessageTypes": "OrderPlaced"})
    ep.start(lambda msg, tx: tx.reply(msg, b"ok"))               # the endpoint's concurrency model
    reply = ep.request("Billing", b"...").result(10)             # a callback, on this instance
    ep.close()

Each queue is read through one consumer per process (kafka/receiver.py), in the queue's consumer
group: instances compete by partitions, and inside a process every message is a group of its own,
so any reader takes any message. A handler's transaction commits its sends and the removal of its
message in one Kafka transaction (transport_transaction.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, Mapping, Self

from kbroker import config
from kbroker.core.cluster import ClusterLike
from kbroker.core.records import Record
from kbroker.core.transport.endpoint import (MONITOR, PRIMARY_PARTITIONS, EndpointSettings, FailedDeliveries, default_machine,
                                              install_plan)
from kbroker.core.transport.message import TransportMessage, canonical_id, new_message, to_headers
from kbroker.embedded import resolve_cluster
from kbroker.errors import InvalidArgumentError, SendFailedError
from kbroker.kafka.clients import brokers_answering, produce_within
from kbroker.kafka.committer import GroupCommitter, OpenTransactions
from kbroker.kafka.dead_letters import DeadLetters
from kbroker.kafka.receiver import Lease, QueueReceiver
from kbroker.kafka.transport.queues import (MAX_BODY_BYTES, QueueDirectory, durable_producer, express_producer, install,
                                            transport_receiver)
from kbroker.sdk.transport.transaction import Handler, TransportTransaction

log = logging.getLogger("kbroker.transport")


def endpoint(name: str, *, bootstrap: ClusterLike | None = None, **kwargs: Any) -> TransportEndpoint:
    """An endpoint instance, connected by the broker rule: `bootstrap` (an address or a Cluster),
    else KBROKER_BOOTSTRAP, else the embedded broker (see TransportEndpoint)."""
    return TransportEndpoint(name, cluster=bootstrap, **kwargs)  # which resolves it


def send_message(cluster: ClusterLike, namespace: str, queue: str, body: bytes | None,
                 headers: Mapping[str, str] | None = None, *, reply_to_address: str | None = None,
                 **kw: Any) -> str:
    """One send from outside any endpoint (the CLI's): no ReplyToAddress unless given."""
    with TransportEndpoint("kbroker-cli", cluster=cluster, namespace=namespace, secondary=False) as ep:
        return ep.send(queue, body, headers, reply_to_address=reply_to_address or "", **kw)


class TransportEndpoint:
    """One instance of endpoint `name`: sends, transactions, and (with start) readers of its
    primary queue under its concurrency model and of its secondary queue `name.machine`.

    concurrency: `monitor` (3.0, default), `ramp` (2.1) or `fixed` (pre-2.0); max_concurrency is
    MaximumConcurrencyLevel. secondary=False disables the secondary queue (replies then come to
    the primary queue); satellite=True is a satellite receiver (no secondary queue).
    install=True creates the queues first, as an installer would. `cluster`: where Kafka is (an
    address or a Cluster; None: the broker rule, embedded.resolve_cluster)."""

    def __init__(self, name: str, *, cluster: ClusterLike | None = None, namespace: str | None = None,
                 machine: str | None = None, secondary: bool = True, concurrency: str = MONITOR,
                 max_concurrency: int = 8, secondary_readers: int = 1, max_deliveries: int = 5,
                 satellite: bool = False, install: bool = False, partitions: int | None = None,
                 commit_interval: float = 0.005, max_buffered: int = 20_000, ack_timeout: float = 30.0):
        try:
            self.settings = EndpointSettings(name, machine or default_machine(), secondary, concurrency,
                                             max_concurrency, secondary_readers, max_deliveries, satellite)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self.cluster = resolve_cluster(cluster)
        self.namespace = config.namespace(namespace)
        brokers_answering(self.cluster, timeout=10)  # BrokerUnavailableError when none answers
        if install:
            self.install(partitions)
        self._ack_timeout, self._commit_interval, self._max_buffered = ack_timeout, commit_interval, max_buffered
        self._producer = durable_producer(self.cluster)
        self._queues = QueueDirectory(self.namespace, self._producer)
        self._express: Any = None
        self._errors: list[Any] = []
        self._lock = threading.RLock()
        self._committer: GroupCommitter | None = None
        self._receivers: dict[str, QueueReceiver] = {}
        self._callbacks: dict[str, concurrent.futures.Future[TransportMessage]] = {}
        self._readers: list[Any] = []
        self._closing = False
        self.open_transactions = OpenTransactions()
        self.failures = FailedDeliveries()
        self._dead_letters = DeadLetters(self.namespace, lambda: self.committer)
        self.counters: Counter[str] = Counter()

    @property
    def bootstrap(self) -> str:
        """The cluster's address, as text."""
        return self.cluster.bootstrap

    # --- installer -------------------------------------------------------------------------

    def install(self, partitions: int | None = None) -> list[str]:
        """Create this instance's queues (and the dead-letter topic) where missing."""
        s = self.settings
        plan = install_plan(s.name, s.machine, secondary=s.secondary_queue is not None,
                            partitions=partitions or PRIMARY_PARTITIONS, satellite=s.satellite)
        return install(self.cluster, self.namespace, plan)

    # --- the runtime transactions share ------------------------------------------------------

    @property
    def committer(self) -> GroupCommitter:
        """The endpoint's group committer, started on first use."""
        with self._lock:
            if self._committer is None:
                self._committer = GroupCommitter(self.cluster, self.namespace, interval=self._commit_interval,
                                                 open_transactions=self.open_transactions).start()
            return self._committer

    def receiver(self, queue: str) -> QueueReceiver:
        """The process's receiver of a transport queue (one consumer per queue)."""
        with self._lock:
            r = self._receivers.get(queue)
            if r is None:
                topic = self._queues.topic(queue)  # TransportQueueNotFoundError before any consumer joins
                r = self._receivers[queue] = transport_receiver(
                    self.cluster, self.namespace, queue, topic, dead_letter=self._dead_letter_malformed,
                    commit_barrier=self.committer.barrier, max_buffered=self._max_buffered)
            return r

    def closing(self) -> bool:
        """Whether close() has begun: a waiting receive gives up."""
        return self._closing

    def count(self, what: str, n: int = 1) -> None:
        """Add `n` to one of the endpoint's counters (received, committed, expired, ...)."""
        with self._lock:
            self.counters[what] += n

    def record(self, destination: str, body: bytes | None, headers: Mapping[str, str] | None, *,
               correlation_id: str | None, reply_to_address: str | None, recoverable: bool,
               time_to_be_received: float | None, message_id: str | None) -> Record:
        """The record of a send to `destination` (its queue must exist)."""
        topic = self._queues.topic(destination)
        if body is not None and len(body) > MAX_BODY_BYTES:  # refused now: at commit it would fail every time
            raise InvalidArgumentError(f"the body is {len(body):,} bytes; a transport queue takes at most "
                                       f"{MAX_BODY_BYTES:,}")
        try:
            msg = new_message(body, headers, now_ms=int(time.time() * 1000), message_id=message_id,
                              correlation_id=correlation_id,
                              reply_to_address=self._reply_to(reply_to_address),
                              recoverable=recoverable, time_to_be_received=time_to_be_received)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return (topic, msg.id.encode(), msg.body, to_headers(msg))

    def _reply_to(self, given: str | None) -> str | None:
        """ReplyToAddress: this instance's reply queue by default; "" for none."""
        if given is None:
            return self.settings.reply_address
        return given or None

    def _dead_letter_malformed(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """On the poll thread: a record that is not a transport message goes to the dead-letter
        topic with its reason, its offset committed with it; the queue goes on."""
        self.count("dead_lettered")
        self._dead_letters.submit(receiver, record, reason)

    def dead_letter(self, lease: Lease, record: Any, reason: str) -> None:
        """A poison message: moved to the dead-letter topic (set aside if Kafka refuses the
        copy, kafka/dead_letters.py), committed before returning."""
        log.warning("message at %s[%s]@%s moved to the dead-letter topic: %s", lease.receiver.topic,
                    record.partition(), record.offset(), reason)
        try:
            self._dead_letters.commit(lease, record, reason)
        finally:
            lease.receiver.release(lease, True)
        self.count("dead_lettered")

    # --- statements ------------------------------------------------------------------------

    def transaction(self) -> TransportTransaction:
        """Begin a transaction: receive, send and reply, then commit or roll back."""
        return TransportTransaction(self)

    def send(self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None, *,
             correlation_id: str | None = None, reply_to_address: str | None = None, recoverable: bool = True,
             time_to_be_received: float | None = None, message_id: str | None = None) -> str:
        """Send outside a transaction; returns the Id. Recoverable: returns once every in-sync
        replica has it (idempotent producer). Recoverable = False: the express path, handed to
        the client and acknowledged by the leader only, not waited for."""
        topic, key, value, headers_ = self.record(
            destination, body, headers, correlation_id=correlation_id, reply_to_address=reply_to_address,
            recoverable=recoverable, time_to_be_received=time_to_be_received, message_id=message_id)
        if not recoverable:
            with self._lock:
                if self._express is None:
                    self._express = express_producer(self.cluster)
            produce_within(self._express, topic, self._ack_timeout, key=key, value=value, headers=headers_)
            self._express.poll(0)
            return key.decode()
        with self._lock:
            produce_within(self._producer, topic, self._ack_timeout, key=key, value=value, headers=headers_,
                           on_delivery=self._on_delivery)
            remaining = self._producer.flush(self._ack_timeout)
            errors, self._errors = self._errors, []
        if remaining or errors:
            raise SendFailedError(f"Kafka did not acknowledge the message to {destination}: "
                                  f"{errors[0].str() if errors else 'timed out'}")
        return key.decode()

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(err)

    def request(self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None,
                **kw: Any) -> concurrent.futures.Future[TransportMessage]:
        """Send and register a callback: the future completes with the reply (a message whose
        CorrelationId is this one's Id) when it reaches this instance's reply queue."""
        future: concurrent.futures.Future[TransportMessage] = concurrent.futures.Future()
        try:
            mid = canonical_id(kw.pop("message_id", None) or str(uuid.uuid4()))  # the key replies come back with
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        with self._lock:
            self._callbacks[mid] = future
        try:
            self.send(destination, body, headers, message_id=mid, **kw)
        except Exception:
            with self._lock:
                self._callbacks.pop(mid, None)
            raise
        return future

    def take_callback(self, msg: TransportMessage) -> concurrent.futures.Future[TransportMessage] | None:
        """The callback waiting for `msg` (a reply to a request of this instance), taken."""
        if not msg.correlation_id:
            return None
        with self._lock:
            return self._callbacks.pop(msg.correlation_id, None)

    def receive(self, wait: float | None = 0.0, *, queue: str | None = None) -> TransportMessage | None:
        """Receive one message in a transaction of its own, committed before it returns."""
        with self.transaction() as tx:
            return tx.receive(wait, queue=queue)

    # --- handling ---------------------------------------------------------------------------

    def handle_one(self, queue: str, handler: Handler, wait: float | None, give_up_fast: bool = False,
                   on_received: Callable[[], None] = lambda: None) -> bool:
        """One transaction: receive from `queue`, hand the message to its callback or `handler`,
        commit (a failure rolls back). Returns whether a message was there. `on_received` is
        called once the receive returned (or failed), message or not."""
        tx = self.transaction()
        try:
            try:
                msg = tx.receive(wait, queue=queue, buffered_only=give_up_fast)
            finally:
                on_received()
            if msg is None:
                tx.commit()  # expired messages it removed, if any
                return False
            callback = self.take_callback(msg)
            if callback is None:
                handler(msg, tx)
            tx.commit()
            if callback is not None:
                callback.set_result(msg)
        except Exception as exc:
            self.handling_failed(tx, queue, exc)
        return True

    def handling_failed(self, tx: TransportTransaction, queue: str, exc: Exception) -> None:
        """A handler raised (its transaction rolls back and counts a failed delivery), or its
        commit failed (the transaction is over: the message comes back by itself)."""
        if tx.state == "open":
            tx.rollback(f"{type(exc).__name__}: {exc}")
            self.count("failed")
            log.warning("handler on %s failed; its transaction rolled back: %s", queue, exc)
        else:
            log.warning("commit on %s failed: %s", queue, exc)

    def start(self, handler: Handler) -> Self:
        """Start the readers: the primary queue's under the endpoint's concurrency model, the
        secondary queue's (`secondary_readers`, 1 by default) under the same model."""
        from kbroker.sdk.transport.readers import readers_for

        s = self.settings
        self._readers.append(readers_for(self, s.primary_queue, handler, s.max_concurrency).start())
        if s.secondary_queue is not None:
            self._readers.append(readers_for(self, s.secondary_queue, handler, s.secondary_readers).start())
        return self

    @property
    def readers(self) -> list[Any]:
        """The running reader sets: the primary queue's first, then the secondary's."""
        return list(self._readers)

    def stats(self) -> dict[str, Any]:
        """The endpoint's counters, its reader sets and what each queue's receiver holds."""
        with self._lock:
            return {"endpoint": self.settings.name, "machine": self.settings.machine,
                    "model": self.settings.model, "counters": dict(self.counters),
                    "readers": [r.stats() for r in self._readers],
                    "queues": {q: r.stats() for q, r in self._receivers.items()}}

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the readers after their current transactions."""
        readers, self._readers = self._readers, []
        for r in readers:
            r.stop(timeout)

    def close(self) -> None:
        """Stop reading, commit what is pending and flush the sends."""
        self.stop()
        self._closing = True
        with self._lock:
            for r in self._receivers.values():
                r.close()
            self._receivers.clear()
            if self._committer is not None:
                self._committer.close()
                self._committer = None
            for f in self._callbacks.values():
                f.cancel()
            self._callbacks.clear()
        self._producer.flush(self._ack_timeout)
        if self._express is not None:
            self._express.flush(self._ack_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
