"""The transport face: endpoints that exchange transport messages the way NServiceBus's SQL
Server transport does (docs/sources.md), over kbroker's Kafka machinery. No dialogs: a send INSERTs a
message into a queue, a receive takes the oldest one any instance has not taken.

    ep = kbroker.transport.endpoint("Sales", install=True)     # queues Sales and Sales.<machine>
    ep.send("Billing", b'{"order": 1}', {"NServiceBus.EnclosedMessageTypes": "OrderPlaced"})
    ep.start(lambda msg, tx: tx.reply(msg, b"ok"))               # the endpoint's concurrency model
    reply = ep.request("Billing", b"...").result(10)             # a callback, on this instance
    ep.close()

Each queue is read through one consumer per process (kafka/receive/receiver.py), in the queue's consumer
group: instances compete by partitions, and inside a process every message is a group of its own,
so any reader takes any message. A handler's transaction commits its sends and the removal of its
message in one Kafka transaction (transport_transaction.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Self

from kbroker import config, tracing
from kbroker.core.cluster import ClusterLike
from kbroker.core.transport.bridge import CLUSTER_RE
from kbroker.core.transport.circuit_breaker import TIME_TO_WAIT, ReceiveCircuitBreaker
from kbroker.core.transport.delayed import DelayedDelivery
from kbroker.core.transport.endpoint import (
    MONITOR,
    PRIMARY_PARTITIONS,
    TransportSettings,
    default_machine,
    install_plan,
)
from kbroker.core.transport.message import TransportMessage, canonical_id
from kbroker.core.transport.recoverability import ErrorResult, Recoverability
from kbroker.core.transport.subscriptions import STALENESS
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.embedded import resolve_cluster
from kbroker.errors import InvalidArgumentError
from kbroker.kafka.clients import produce_within
from kbroker.kafka.transport.bridge import BridgePusher, install_positions
from kbroker.kafka.transport.delayed_store import DelayedMover
from kbroker.kafka.transport.queues import express_producer, install
from kbroker.sdk.fenced_retry import receive_fenced_again
from kbroker.sdk.transport.background import Background
from kbroker.sdk.transport.handling import Handling
from kbroker.sdk.transport.on_error import ErrorContext
from kbroker.sdk.transport.pubsub import PubSub
from kbroker.sdk.transport.purge import PURGE_TIMEOUT, StartupPurge
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import Handler, TransportTransaction

log = logging.getLogger("kbroker.transport")
RECOVERABILITY = Recoverability()  # NServiceBus's defaults: 5 immediate, 3 delayed (10 s more each), `error`


def endpoint(name: str, *, bootstrap: ClusterLike | None = None, **kwargs: Any) -> TransportEndpoint:
    """An endpoint instance, connected by the broker rule: `bootstrap` (an address or a Cluster),
    else KBROKER_BOOTSTRAP, else the embedded broker (see TransportEndpoint)."""
    return TransportEndpoint(name, cluster=bootstrap, **kwargs)  # which resolves it


def send_message(
    cluster: ClusterLike,
    namespace: str,
    queue: str,
    body: bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    reply_to_address: str | None = None,
    **kw: Any,
) -> str:
    """One send from outside any endpoint (the CLI's, a send-only one): no ReplyToAddress unless
    given. A delayed send (`delay=` or `not_before=`) waits in the delayed store of the endpoint
    `queue` names unless `delayed_store=` names another: its instances move it when due."""
    if kw.get("delay") is not None or kw.get("not_before") is not None:
        kw.setdefault("delayed_store", queue)
    with TransportEndpoint("kbroker-cli", cluster=cluster, namespace=namespace, send_only=True) as ep:
        return ep.send(queue, body, headers, reply_to_address=reply_to_address or "", **kw)


class TransportEndpoint(PubSub, Handling, Background):
    """One instance of endpoint `name`: sends, transactions, and (with start) readers of its
    primary queue under its concurrency model and of its secondary queue `name.machine`.

    send_only=True: an endpoint that only sends (no secondary queue, no delayed store of its
    own, no start). delayed_delivery: how the started instance moves its delayed store's due
    rows (core/transport/delayed.py, DelayedDelivery). subscription_staleness: how old this
    instance's copy of the subscription table may be when it publishes (5 s). recoverability:
    immediate retries, delayed retries, the error queue (core/transport/recoverability.py;
    None: the dead-letter topic after `max_deliveries` failures in this process). audit_queue:
    where a copy of each message a handler processed goes, in its transaction (None: no audit).
    on_critical_error: called (once, until receiving works again) when receiving has failed for
    time_to_wait_before_critical_error seconds (120), as NServiceBus's receive circuit breaker.
    transaction_mode: SendsAtomicWithReceive (default), ReceiveOnly or None
    (core/transport/transaction_modes.py). outbox: an Outbox (sdk/transport/outbox.py; the asyncio
    endpoint's: an AsyncOutbox): handlers write to the database through `tx.db`, send once with it.
    on_error: called when a handler raised, in the message's transaction, before the
    recoverability policy (sdk/transport/on_error.py: ErrorContext in, ErrorResult or None out).
    purge_expired_on_startup: start() first removes the expired messages at the head of each
    input queue's partitions it is assigned, within purge_timeout s (30; sdk/transport/purge.py).
    bridges: the other clusters this endpoint sends to, `queue@namespace@cluster`, by name: the
    cluster's address or Cluster (None: the client profile of that name); cluster_name: this
    cluster's name in the far sides' bridges, so replies come back (sdk/transport/background.py).

    concurrency: `monitor` (3.0, default), `ramp` (2.1) or `fixed` (pre-2.0); max_concurrency is
    MaximumConcurrencyLevel. secondary=False disables the secondary queue (replies then come to
    the primary queue); satellite=True is a satellite receiver (no secondary queue).
    install=True creates the queues first (and the bridges' topics), as an installer would. `cluster`: where Kafka is (an
    address or a Cluster; None: the broker rule, embedded.resolve_cluster)."""

    def __init__(
        self,
        name: str,
        *,
        cluster: ClusterLike | None = None,
        namespace: str | None = None,
        machine: str | None = None,
        secondary: bool = True,
        concurrency: str = MONITOR,
        max_concurrency: int = 8,
        secondary_readers: int = 1,
        max_deliveries: int = 5,
        satellite: bool = False,
        install: bool = False,
        partitions: int | None = None,
        commit_interval: float = 0.005,
        max_buffered: int = 20_000,
        ack_timeout: float = 30.0,
        send_only: bool = False,
        delayed_delivery: DelayedDelivery | None = None,
        subscription_staleness: float = STALENESS,
        recoverability: Recoverability | None = RECOVERABILITY,
        audit_queue: str | None = None,
        on_critical_error: Callable[[BaseException], None] | None = None,
        time_to_wait_before_critical_error: float = TIME_TO_WAIT,
        transaction_mode: TransactionMode | str = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
        outbox: Any = None,
        on_error: Callable[[ErrorContext], ErrorResult | None] | None = None,
        purge_expired_on_startup: bool = False,
        purge_timeout: float = PURGE_TIMEOUT,
        bridges: Mapping[str, ClusterLike | None] | None = None,
        cluster_name: str | None = None,
    ):
        try:
            settings = TransportSettings(
                name,
                machine or default_machine(),
                secondary,
                concurrency,
                max_concurrency,
                secondary_readers,
                max_deliveries,
                satellite,
                send_only,
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self.settings = settings
        if isinstance(subscription_staleness, bool) or not 0 <= subscription_staleness <= 3600:
            raise InvalidArgumentError(f"subscription_staleness must be 0-3600 seconds, not {subscription_staleness!r}")
        self.cluster = resolve_cluster(cluster)
        self.namespace = config.namespace(namespace)
        self.runtime = TransportRuntime(
            self.cluster,
            self.namespace,
            settings,
            ack_timeout=ack_timeout,
            commit_interval=commit_interval,
            max_buffered=max_buffered,
        )
        self.runtime.subscription_staleness = subscription_staleness
        self.runtime.recoverability = recoverability
        self.runtime.audit_queue = audit_queue
        try:
            self.runtime.transaction_mode = TransactionMode.of(transaction_mode)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self.runtime.outbox = outbox
        self.runtime.on_error = on_error
        try:
            self.breaker = ReceiveCircuitBreaker(time_to_wait_before_critical_error)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self.on_critical_error = on_critical_error or (lambda exc: None)  # (logged by the breaker in any case)
        self.startup_purge = StartupPurge(purge_expired_on_startup, purge_timeout)
        if cluster_name is not None and not CLUSTER_RE.fullmatch(str(cluster_name)):
            raise InvalidArgumentError(f"cluster name {cluster_name!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
        self.runtime.cluster_name = cluster_name
        self._bridges = self.bridges_of(bridges)
        if install:
            self.install(partitions)
        self._express: Any = None
        self._lock = threading.Lock()  # the express producer and the callbacks
        self._callbacks: dict[str, concurrent.futures.Future[TransportMessage]] = {}
        self._readers: list[Any] = []
        self._delayed = delayed_delivery or DelayedDelivery()
        self._mover: DelayedMover | None = None
        self._pushers: dict[str, BridgePusher] = {}

    @property
    def bootstrap(self) -> str:
        """The cluster's address, as text."""
        return self.cluster.bootstrap

    # --- installer -------------------------------------------------------------------------

    def install(self, partitions: int | None = None) -> list[str]:
        """Create this instance's queues, its delayed store, the error queue, the subscription
        table and the dead-letter topic where missing."""
        s = self.settings
        plan = install_plan(
            s.name,
            s.machine,
            secondary=s.secondary_queue is not None,
            partitions=partitions or PRIMARY_PARTITIONS,
            satellite=s.satellite,
            error_queue=None if self.runtime.recoverability is None else self.runtime.recoverability.error_queue,
            audit_queue=self.runtime.audit_queue,
            bridges=tuple(self._bridges),
        )
        created = install(self.cluster, self.namespace, plan)
        for far in self._bridges.values():  # where the pushers keep how far they went, on the far side
            created += install_positions(far, self.namespace)
        return created

    # --- statements ------------------------------------------------------------------------

    def transaction(self) -> TransportTransaction:
        """Begin a transaction: receive, send and reply, then commit or roll back."""
        return TransportTransaction(self.runtime)

    def send(
        self,
        destination: str,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        *,
        correlation_id: str | None = None,
        reply_to_address: str | None = None,
        recoverable: bool = True,
        time_to_be_received: float | None = None,
        message_id: str | None = None,
        delay: float | None = None,
        not_before: datetime | float | str | None = None,
        delayed_store: str | None = None,
    ) -> str:
        """Send outside a transaction; returns the Id. Recoverable: returns once every in-sync
        replica has it (idempotent producer). Recoverable = False: the express path, handed to
        the client and acknowledged by the leader only, not waited for.

        `delay` (seconds) or `not_before` (a datetime, ISO 8601 text or epoch seconds): delayed
        delivery. The message waits in a delayed store until then (this endpoint's, or
        `delayed_store`'s: a send-only endpoint has none) and is moved to `destination` by
        the store's endpoint's running instances, exactly once; a delayed send is always
        recoverable."""
        headers = tracing.with_trace_headers(headers, self.runtime.namespace, destination)
        record, mid = self.runtime.record(
            destination,
            body,
            headers,
            correlation_id=correlation_id,
            reply_to_address=reply_to_address,
            recoverable=recoverable,
            time_to_be_received=time_to_be_received,
            message_id=message_id,
            delay=delay,
            not_before=not_before,
            delayed_store=delayed_store,
        )
        topic, key, value, headers_ = record
        if not recoverable and delay is None and not_before is None:
            with self._lock:
                if self._express is None:
                    self._express = express_producer(self.cluster)
            produce_within(self._express, topic, self.runtime.ack_timeout, key=key, value=value, headers=headers_)
            self._express.poll(0)
            return mid
        with self.runtime.acknowledged() as produce:
            produce(record)
        return mid

    def request(
        self, destination: str, body: bytes | None, headers: Mapping[str, str] | None = None, **kw: Any
    ) -> concurrent.futures.Future[TransportMessage]:
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
        """Receive one message in a transaction of its own, committed before it returns; a
        commit a rebalance fenced is tried again (kbroker/sdk/fenced_retry.py)."""

        def attempt(left: float | None) -> TransportMessage | None:
            with self.transaction() as tx:
                return tx.receive(left, queue=queue)

        return receive_fenced_again(attempt, wait, queue or self.settings.name)

    # --- handling ---------------------------------------------------------------------------

    def start(self, handler: Handler) -> Self:
        """Start the readers: the primary queue's under the endpoint's concurrency model, the
        secondary queue's (`secondary_readers`, 1 by default) under the same model."""
        from kbroker.sdk.transport.pump import pump_for

        s = self.settings
        if s.send_only:
            raise InvalidArgumentError(f"{s.name} is a send-only endpoint: it does not receive")
        if getattr(self.runtime.outbox, "asynchronous", False):
            raise InvalidArgumentError("an AsyncOutbox is the asyncio endpoint's: give this endpoint an Outbox")
        self.start_mover()
        self.start_bridges()
        self.startup_purge.run(self)  # before the readers: the expired head of each partition
        self._readers.append(pump_for(self, s.primary_queue, handler, s.max_concurrency).start())
        if s.secondary_queue is not None:
            self._readers.append(pump_for(self, s.secondary_queue, handler, s.secondary_readers).start())
        return self

    def change_concurrency(self, max_concurrency: int) -> None:
        """Change the primary queue's MaximumConcurrencyLevel while the readers run (NServiceBus's
        ChangeConcurrency): above the new level no new message is taken; the handlers running
        finish first. Kept for the next start()."""
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InvalidArgumentError(f"max_concurrency must be a whole number of at least 1, not {max_concurrency!r}")
        self.settings = self.runtime.settings = replace(self.settings, max_concurrency=max_concurrency)
        if self._readers:
            self._readers[0].resize(max_concurrency)

    @property
    def readers(self) -> list[Any]:
        """The running reader sets: the primary queue's first, then the secondary's."""
        return list(self._readers)

    def stats(self) -> dict[str, Any]:
        """The endpoint's counters, its reader sets and what each queue's receiver holds."""
        with self._lock:
            return {
                "endpoint": self.settings.name,
                "machine": self.settings.machine,
                "model": self.settings.model,
                "counters": dict(self.runtime.counters),
                "readers": [r.stats() for r in self._readers],
                "queues": {q: r.stats() for q, r in self.runtime.receivers().items()},
                "delayed": None if self._mover is None else self._mover.stats(),
                "bridges": {c: b.stats() for c, b in self._pushers.items()},
            }

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the readers after their current transactions, and the delayed store's mover."""
        readers, self._readers = self._readers, []
        for r in readers:
            r.stop(timeout)
        self.stop_background()

    def close(self) -> None:
        """Stop reading, commit what is pending and flush the sends."""
        self.stop()
        self.runtime.close()
        with self._lock:
            for f in self._callbacks.values():
                f.cancel()
            self._callbacks.clear()
            if self._express is not None:
                self._express.flush(self.runtime.ack_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
