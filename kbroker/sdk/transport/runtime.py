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
from datetime import datetime, timezone
from typing import Any, Mapping

from kbroker.core.cluster import Cluster
from kbroker.core.records import Record
from kbroker.core.transport.bridge import message_record
from kbroker.core.transport.delayed import delayed_record, due_time
from kbroker.core.transport.endpoint import FailedDeliveries, TransportSettings
from kbroker.core.transport.message import TransportMessage, new_message
from kbroker.core.transport.recoverability import (
    Action,
    Recoverability,
    delayed_retry_headers,
    failed_headers,
    rounds_of,
)
from kbroker.core.transport.subscriptions import STALENESS
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.errors import InvalidArgumentError, TransportQueueNotFoundError
from kbroker.kafka.receive.receiver import Lease, QueueReceiver
from kbroker.kafka.transport.queues import MAX_BODY_BYTES, QueueDirectory, transport_receiver
from kbroker.kafka.transport.subscription_store import SubscriptionCache
from kbroker.kafka.txn.commit_requests import CommitRequest
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
        self.subscription_staleness = STALENESS
        self.recoverability: Recoverability | None = Recoverability()
        self.audit_queue: str | None = None  # where processed messages are copied (core/transport/audit.py)
        self.transaction_mode = TransactionMode.SENDS_ATOMIC_WITH_RECEIVE
        self.outbox: Any = None  # sdk/transport/outbox.Outbox (SQLAlchemy: imported only by who makes one)
        self.on_error: Any = None  # the application's (sdk/transport/on_error.py), called when a handler raised
        self._subscriptions: SubscriptionCache | None = None
        self.cluster_name: str | None = None  # this cluster as the far sides' bridges name it

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

    def subscriptions(self) -> SubscriptionCache:
        """The instance's copy of the namespace's subscription table (made on first use)."""
        with self._counting:
            if self._subscriptions is None:
                self._subscriptions = SubscriptionCache(
                    self.cluster, self.namespace, staleness=self.subscription_staleness
                )
            return self._subscriptions

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
        delay: float | None = None,
        not_before: datetime | float | str | None = None,
        delayed_store: str | None = None,
    ) -> tuple[Record, str]:
        """The record of a send to `destination` (its queue must exist), and the message's Id. `reply_to_address`:
        None for this instance's reply queue, "" for none. With `delay` (seconds) or
        `not_before` the record is a row of a delayed store instead: `delayed_store`'s (an
        endpoint's name), by default this endpoint's own, which a send-only endpoint lacks."""
        self.queues.topic(destination)  # TransportQueueNotFoundError now, not at commit
        now = time.time() * 1000
        now_ms = int(now)
        try:
            due_ms = due_time(now, delay, not_before)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        store = None
        if due_ms is not None:
            if delayed_store is None and self.settings.send_only:
                raise InvalidArgumentError(
                    f"{self.settings.name} is a send-only endpoint: it has no delayed store "
                    "(name a receiving endpoint's with delayed_store=)"
                )
            store = self.queues.delayed_store(delayed_store or self.settings.name)
        if body is not None and len(body) > MAX_BODY_BYTES:  # refused now: at commit it would fail every time
            raise InvalidArgumentError(
                f"the body is {len(body):,} bytes; a transport queue takes at most {MAX_BODY_BYTES:,}"
            )
        reply_to = self.settings.reply_address if reply_to_address is None else reply_to_address or None
        if reply_to_address is None and "@" in destination and reply_to is not None:
            reply_to = f"{reply_to}@{self.namespace}"  # a reply from another namespace finds its way back
            if destination.count("@") == 2 and self.cluster_name:
                reply_to = f"{reply_to}@{self.cluster_name}"  # and from another cluster
        try:
            msg = new_message(
                body,
                headers,
                now_ms=now_ms,
                message_id=message_id,
                correlation_id=correlation_id,
                reply_to_address=reply_to,
                recoverable=recoverable,
                time_to_be_received=time_to_be_received,
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if store is not None and due_ms is not None:
            return delayed_record(store, msg, destination, due_ms), msg.id
        return message_record(destination, self.namespace, msg), msg.id

    def _dead_letter_malformed(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """On the poll thread: a record that is not a transport message goes to the dead-letter
        topic with its reason, its offset committed with it; the queue goes on."""
        self.count("dead_lettered")
        self.dead_letter(receiver, record, reason)

    def recovered(self, lease: Lease, taken: Any, msg: TransportMessage) -> bool:
        """Whether `msg`, which failed here before, was moved on instead of handed out again:
        to the delayed store for a delayed retry or to the error queue, as the recoverability
        policy says (without one: to the dead-letter topic after `max_deliveries` failures).
        The move commits with the message's removal before this returns."""
        position = (lease.receiver.topic, taken.partition, taken.offset)
        failures = self.failures.count(position)
        if not failures or self.failures.take_retry(position):
            return False
        policy = self.recoverability
        if policy is None:
            if failures < self.settings.max_deliveries:
                return False
            reason = f"handler failed {failures} times: {self.failures.reason(position)}"
            self.dead_letter_poison(lease, taken.record, reason)
            return True
        failure = self.failures.failure(position)
        rounds = rounds_of(msg.headers)
        action = policy.decide(failures, rounds, failure, delayed=self._can_delay())
        if action is Action.IMMEDIATE:
            return False
        now = datetime.now(timezone.utc)
        try:
            if action is Action.DELAYED:
                hs = delayed_retry_headers(msg.headers, rounds, now)
                record, _ = self.copy(msg, msg.queue or "", hs, delay=policy.delay(rounds))
            else:
                s = self.settings
                hs = failed_headers(msg.headers, msg.queue or "", failure, endpoint=s.name, machine=s.machine, now=now)
                record, _ = self.copy(msg, policy.error_queue, hs)
        except TransportQueueNotFoundError as exc:  # no error queue installed: the dead-letter topic, not a loop
            self.dead_letter_poison(lease, taken.record, f"{failures} failures, then {exc}")
            return True
        try:
            self.committer.commit(CommitRequest([record], [lease]))
        except Exception:
            lease.receiver.release(lease, False)
            raise
        lease.receiver.release(lease, True)
        self.failures.forget(position)
        self.count("delayed_retries" if action is Action.DELAYED else "errors")
        log.warning("message %s of %s, failed %d times: %s", msg.id, msg.queue, failures, action.value)
        return True

    def copy(self, msg: TransportMessage, queue: str, headers: Mapping[str, str], **kw: Any) -> tuple[Record, str]:
        """The record of `msg` (its Id, body and columns, `headers` instead of its own) sent to
        `queue`: its delayed retry, its error-queue or audit copy, a retry sending it back."""
        return self.record(
            queue,
            msg.body,
            headers,
            correlation_id=msg.correlation_id,
            reply_to_address=msg.reply_to_address or "",
            recoverable=msg.recoverable,
            time_to_be_received=None,
            message_id=msg.id,
            **kw,
        )

    def _can_delay(self) -> bool:
        """Whether this endpoint can retry later: not a satellite, and its delayed store exists."""
        if self.settings.satellite or self.settings.send_only:
            return False
        try:
            self.queues.delayed_store(self.settings.name)
        except TransportQueueNotFoundError:
            return False
        return True

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
        if self._subscriptions is not None:
            self._subscriptions.close()
