"""The SDK: Service Broker's statements as methods of a Broker connected to one namespace.

    broker = kbroker.connect()
    handle = broker.begin_dialog(from_service, to_service, contract)
    broker.send(handle, message_type, body)
    with broker.transaction() as tx:
        for msg in tx.receive(queue, top=10, wait=5): ...

Outside a transaction each statement commits on its own, as in Service Broker: SEND returns once
Kafka acknowledged the message (idempotent producer), and RECEIVE is a transaction of its own.
Both paths build their records with the same Statements (kbroker.core.statements), so a
statement validates the same way inside and outside a transaction; the Broker only produces
them and holds the process's runtime (receivers, group committer, endpoint cache).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

import orjson

from kbroker import config
from kbroker.core import names
from kbroker.core.catalog.models import END_DIALOG, Catalog
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.conversation_endpoint import must_persist
from kbroker.core.envelope import Message
from kbroker.core.locks import ConversationLocks
from kbroker.core.poison import PoisonCounter
from kbroker.core.records import Record
from kbroker.core.sequence_reach import reach
from kbroker.core.statements import Statements
from kbroker.embedded import resolve_cluster
from kbroker.errors import CatalogError, QueueNameCollisionError, SendFailedError
from kbroker.kafka import messages
from kbroker.kafka.catalog_store import CatalogWatcher, read_catalog
from kbroker.kafka.clients import brokers_answering, idempotent_producer, produce_within
from kbroker.kafka.committer import GroupCommitter, OpenTransactions
from kbroker.kafka.dead_letters import DeadLetters
from kbroker.kafka.conversation_endpoints import EndpointStore
from kbroker.kafka.receiver import QueueReceiver
from kbroker.kafka.rollbacks import RollbackLog
from kbroker.kafka.transport.secondary import ensure_secondary_queue
from kbroker.kafka.send_leases import SendLeases
from kbroker.sdk.hooks import HookFanOut, ReceiveHooks
from kbroker.sdk.transaction import Transaction

__all__ = ["END_DIALOG", "ERROR_TYPE", "Broker", "connect"]  # the message types, for callers' checks

log = logging.getLogger("kbroker.client")

T = TypeVar("T")


def connect(bootstrap: ClusterLike | None = None, namespace: str | None = None, **kwargs: Any) -> Broker:
    """Connect by the broker rule: `bootstrap` (an address or a Cluster), else KBROKER_BOOTSTRAP,
    else the embedded broker."""
    return Broker(resolve_cluster(bootstrap), config.namespace(namespace), **kwargs)


class Broker:
    """A connection to one namespace: the statements outside a transaction, transaction(), and
    the process's runtime that transactions share (see runtime.Runtime).

    `hooks` is a list of ReceiveHooks the Broker calls around RECEIVE and on rollback."""

    def __init__(self, cluster: ClusterLike, namespace: str, *, ack_timeout: float = 30.0,
                 commit_interval: float = 0.005, max_buffered: int = 20_000, revoke_grace: float = 5.0,
                 lock_timeout: float = 30.0):
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        self._ack_timeout = ack_timeout
        self._commit_interval = commit_interval
        self._max_buffered, self._revoke_grace = max_buffered, revoke_grace
        brokers_answering(cluster, timeout=10)  # BrokerUnavailableError when none answers
        self._producer = idempotent_producer(cluster)
        self._lock = threading.RLock()
        self._errors: list[Any] = []  # KafkaErrors of failed deliveries, until the next flush
        self._catalog: Catalog | None = None
        self._committer: GroupCommitter | None = None  # started on first use
        # Its transactional ids, known before it starts: conversation leases name them (fencing).
        self._transactional_ids = tuple(f"kbroker.{namespace}.{uuid.uuid4()}" for _ in range(2))
        self.open_transactions = OpenTransactions()
        self.conversation_locks = ConversationLocks(lock_timeout)  # SEND's (see locks.py)
        self.endpoints = EndpointStore(cluster, namespace, self._producer)
        self.statements = Statements(namespace, self._lookup, self.endpoints.in_group,
                                     sender_reach=self._sender_reach)
        self._unknown_reach_read = float("-inf")  # when _sender_reach last read for a side unknown here
        self._receivers: dict[tuple[str, str | None], QueueReceiver] = {}  # (queue, instance)
        self._secondary: set[str] = set()  # secondary queue topics known to exist
        self._disabled: set[str] = set()
        self._watcher: CatalogWatcher | None = None  # started with the first receiver
        self._rollbacks: RollbackLog | None = None  # every process's rollbacks; with the first receiver
        self._dead_letters = DeadLetters(namespace, lambda: self.committer)
        self._poison = PoisonCounter()  # counts the queues this process reads itself
        self.hooks: list[ReceiveHooks] = []
        self.receive_hooks: ReceiveHooks = HookFanOut(self.hooks)
        # In reader reports and conversation leases: unique even where pids repeat (containers).
        self._process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.send_leases = SendLeases(cluster, self.endpoints, self.conversation_locks, self._process,
                                      self._fence_ids, ack_timeout=ack_timeout).start()

    @property
    def bootstrap(self) -> str:
        """The cluster's address, as text."""
        return self.cluster.bootstrap

    # --- catalog ------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The namespace's catalog as last read."""
        if self._catalog is None:
            self._catalog = read_catalog(self.cluster, self.namespace)
        return self._catalog

    def refresh_catalog(self) -> Catalog:
        """Read the catalog again (another process may have applied definitions)."""
        self._catalog = read_catalog(self.cluster, self.namespace)
        return self._catalog

    def _lookup(self, fn: Callable[[Catalog], T]) -> T:
        """Catalog lookups re-read the catalog once before saying an object is unknown."""
        try:
            return fn(self.catalog)
        except CatalogError:
            return fn(self.refresh_catalog())

    def _catalog_changed(self, catalog: Catalog) -> None:
        """From the catalog watcher: another process altered the catalog."""
        self._catalog = catalog

    def queue_open(self, queue: str) -> bool:
        """STATUS of a queue as this process knows it now, without asking Kafka: what a waiting
        RECEIVE checks to return at once when the queue is disabled anywhere."""
        try:
            return self.catalog.queue(queue).status == "ON" and queue not in self._disabled
        except CatalogError:
            return False

    def queue_enabled(self, queue: str) -> bool:
        """STATUS of a queue. A disabled one is re-checked against the catalog, so an
        ALTER QUEUE ... STATUS = ON from any process is seen on the next RECEIVE."""
        q = self._lookup(lambda c: c.queue(queue))
        if q.status == "ON" and queue not in self._disabled:
            return True
        q = self.refresh_catalog().queue(queue)
        if q.status == "ON":
            self._disabled.discard(queue)
            self._poison.reset(queue)
            return True
        return False

    # --- the runtime --------------------------------------------------------------------------

    @property
    def committer(self) -> GroupCommitter:
        """The process's group committer, started on first use."""
        with self._lock:
            if self._committer is None:
                self._committer = GroupCommitter(self.cluster, self.namespace, interval=self._commit_interval,
                                                 transactional_ids=self._transactional_ids,
                                                 open_transactions=self.open_transactions).start()
            return self._committer

    def receiver(self, queue: str, instance: str | None = None) -> QueueReceiver:
        """The receiver of a queue, or of its secondary queue for `instance`."""
        with self._lock:
            r = self._receivers.get((queue, instance))
            if r is None:
                q = self._lookup(lambda c: c.queue(queue))
                topic = None if instance is None else self.secondary_queue(q.name, instance)
                committer = self.committer
                r = self._receivers[(queue, instance)] = QueueReceiver(
                    self.cluster, self.namespace, queue, dead_letter=self._dead_letter,
                    max_buffered=self._max_buffered, revoke_grace=self._revoke_grace,
                    commit_barrier=committer.barrier, topic=topic,
                    # A partition that arrives may hold records of conversations moved by another
                    # process since this one cached their endpoints: catch up first.
                    on_assign=self.endpoints.refresh,
                    report=functools.partial(self._report_reader, queue)).start()
                if instance is None:
                    self._poison.watch(queue)  # poison counting covers the queues read here
                if self._watcher is None:  # a reading process learns of ALTER QUEUE within 0.5 s
                    self._watcher = CatalogWatcher(self.cluster, self.namespace, self._catalog_changed).start()
                    self._rollbacks = RollbackLog(self.cluster, self.namespace, self._producer,
                                                  self._process).start()
            return r

    def _report_reader(self, queue: str, stats: dict[str, Any]) -> None:
        """Every few seconds, from a receiver's poll thread: its locks and in-flight counts, for
        `kbroker queue show` (a compacted topic keyed by process and topic; fire and forget)."""
        self._publish_reader(stats["topic"], orjson.dumps(
            {**stats, "queue": queue, "process": self._process, "at": time.time()}))

    def _publish_reader(self, topic: str, value: bytes | None) -> None:
        """This process's entry for `topic` in the readers topic (None: it no longer reads it)."""
        try:
            self._producer.produce(names.readers_topic(self.namespace), key=f"{self._process}/{topic}", value=value)
        except Exception:  # BufferError (local queue full) or KafkaException: a view, not data, so skip it
            log.debug("reader report for %s skipped", topic, exc_info=True)

    def secondary_queue(self, queue: str, instance: str) -> str:
        """The secondary queue topic of `queue` for `instance`, created on first use."""
        topic = names.secondary_queue_topic(self.namespace, queue, instance)
        with self._lock:
            if topic not in self._secondary:
                q = self._lookup(lambda c: c.queue(queue))
                # A catalog applied before apply refused colliding names may still hold them.
                clash = names.secondary_queue_collision(self.catalog.queues, q.name, instance)
                if clash is not None:
                    raise QueueNameCollisionError(f"the secondary queue of {queue} for instance {instance!r}",
                                                  f"queue {clash[0]!r}", clash[1])
                ensure_secondary_queue(self.cluster, self.namespace, q, instance)
                self._secondary.add(topic)
        return topic

    def transaction(self) -> Transaction:
        """BEGIN TRANSACTION: use as a context manager, or call commit()/rollback()."""
        return Transaction(self)

    def note_commit(self, queue: str, taken: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """A transaction that received from `queue` committed: its poison count starts over, and
        the messages it received need no rollback count any more."""
        self._poison.reset(queue)
        if self._rollbacks is not None:
            for topic, offsets in (taken or {}).items():
                self._rollbacks.committed(topic, offsets)

    def note_rollback(self, queue: str, taken: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """Poison-message handling: five rolled-back receives in a row (this process), or five
        rollbacks of one message (any process), disable the queue (core/poison.py)."""
        if not self._poison.watches(queue):
            return
        handling = self._lookup(lambda c: c.queue(queue)).poison_message_handling == "ON"
        verdict = self._poison.rolled_back(queue, handling)
        if self._rollbacks is not None:
            for topic, offsets in (taken or {}).items():
                counts = self._rollbacks.rolled_back(queue, topic, offsets)
                verdict = verdict or self._rollbacks.ledger.verdict(queue, counts, handling)
        if verdict is not None:
            from kbroker.kafka.queues import set_queue_status

            self._disabled.add(verdict.queue)
            set_queue_status(self.cluster, self.namespace, verdict.queue, "OFF", verdict.reason, poison=True)
            self.refresh_catalog()

    # --- statements outside a transaction -----------------------------------------------------

    def _fence_ids(self) -> tuple[str, ...]:
        return self._transactional_ids

    @contextmanager
    def _conversation(self, handle: str) -> Iterator[None]:
        """A statement outside a transaction holds the conversation: among this process's
        threads, then across processes (its lease), then the statement lock."""
        with self.conversation_locks.held(handle):
            self.send_leases.hold(handle, self.conversation_locks.timeout)
            with self._lock:
                yield

    def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG: creates the initiator endpoint and returns its conversation handle."""
        ep = self.statements.new_dialog(from_service, to_service, contract, endpoint_of=self.endpoints.get, **kw)
        if ep.instance is not None:
            self.secondary_queue(self.statements.queue_of(ep.service_name), ep.instance)  # replies land there
        lease = self.send_leases.created(ep)
        with self._lock:
            for record in self.statements.lifetime_records(ep):
                self._produce(record)
            self.endpoints.put(ep)
            self._produce(self.statements.lease_record(lease))
            self._flush()
        self.send_leases.holding(lease)
        return ep.conversation_handle

    def send(self, handle: str, message_type: str = "DEFAULT", body: Any = None, **kw: Any) -> str:
        """SEND ON CONVERSATION: returns the message id once Kafka acknowledged the message."""
        with self._conversation(str(handle)):
            before = self.endpoints.current(str(handle))
            record, message_id, ep = self.statements.message_record(before, message_type, body, **kw)
            self._produce(record)
            if must_persist(before, ep):
                self.endpoints.put(ep)
            else:
                self.endpoints.note(ep.conversation_handle, ep, written=False)
            self._flush()
            return message_id

    def end_conversation(self, handle: str, *, error: int | None = None, description: str | None = None,
                         cleanup: bool = False) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP]."""
        with self._conversation(str(handle)):
            ep = self.endpoints.current(str(handle))
            records, ended = self.statements.end_records(ep, error=error, description=description, cleanup=cleanup)
            for record in records:
                self._produce(record)
            self._produce(self.statements.endpoint_record(ep.conversation_handle, ended))
            self.endpoints.note(ep.conversation_handle, ended)
            self._flush()

    def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds: a DialogTimer message reaches this
        side's queue then (fired by the timer service, which `kbroker worker` runs)."""
        with self._conversation(str(handle)):
            records, ep = self.statements.timer_records(self.endpoints.get(str(handle)), timeout)
            for record in records:
                self._produce(record)
            self.endpoints.put(ep)
            self._flush()

    def receive(self, queue: str, top: int | None = None, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        """RECEIVE outside a transaction: a transaction of its own, committed before it returns.
        top=None: every ready message of one group, as RECEIVE without TOP."""
        with self.transaction() as tx:
            return tx.receive(queue, top, wait, **kw)

    def queue_messages(self, queue: str, conversation_handle: str | None = None) -> list[dict[str, Any]]:
        """The queue's messages like Service Broker's queue view: status 1 = ready, 0 = received
        (listed only with RETENTION = ON, until this side ends the conversation). See retention.py."""
        from kbroker.kafka.retention import queue_messages

        return queue_messages(self.cluster, self.namespace, queue, conversation_handle)

    def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group, committed before it returns."""
        with self.transaction() as tx:
            tx.move_conversation(handle, group)

    # --- plumbing -----------------------------------------------------------------------------

    def _produce(self, record: Record) -> None:
        topic, key, value, headers = record
        produce_within(self._producer, topic, self._ack_timeout, key=key, value=value,
                       headers=messages.wire_headers(headers), on_delivery=self._on_delivery)

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        """Delivery report from librdkafka: `err` is a KafkaError, or None when delivered."""
        if err is not None:
            self._errors.append(err)

    def _flush(self) -> None:
        """Wait until Kafka acknowledged everything produced so far."""
        remaining = self._producer.flush(self._ack_timeout)
        errors, self._errors = self._errors, []
        if remaining or errors:
            reason = errors[0].str() if errors else f"{remaining} message(s) not acknowledged in time"
            raise SendFailedError(f"Kafka did not acknowledge: {reason}")

    def _dead_letter(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """Called on the poll thread: the malformed record's dead letter and its offset commit
        together, without waiting (the poll thread never waits on a commit); set aside if Kafka
        refuses the copy (kafka/dead_letters.py)."""
        self._dead_letters.submit(receiver, record, reason)

    def _sender_reach(self, handle: str, sequence: int) -> int | None:
        """sequence_reach.reach() of side `handle` from the endpoints topic: the records this
        process has read, and, when `sequence` is at or past what they say, the topic read
        forward once (the sender wrote its lease and endpoint before or with the message). For
        a side with no record here the topic is read at most once per `fresh_for` seconds: a
        client that keeps no endpoints must not cost a read per message."""
        known = reach(self.endpoints.lease(handle), self.endpoints.cached(handle))
        if known is None and time.monotonic() - self._unknown_reach_read < self.endpoints.fresh_for:
            return None  # a side with no records here (a client that keeps none): not read per message
        if known is None or sequence >= known:
            self.endpoints.refresh()
            if known is None:
                self._unknown_reach_read = time.monotonic()
            known = reach(self.endpoints.lease(handle), self.endpoints.cached(handle))
        return known

    def close(self) -> None:
        """Stop reading, commit what is pending, write the exact send sequences, and flush."""
        with self._lock:
            for r in self._receivers.values():
                r.close()
                self._publish_reader(r.topic, None)  # no longer read here: drop it from the view
            self._receivers.clear()
            if self._watcher is not None:
                self._watcher.close()
                self._watcher = None
            if self._rollbacks is not None:
                self._rollbacks.close()
                self._rollbacks = None
            self._poison.forget_all()
            if self._committer is not None:
                self._committer.close()
                self._committer = None
            self.endpoints.write_unwritten()  # exact sequences, so a restart leaves no gap
            self.send_leases.close()  # other processes need not wait for the leases to run out
            self.endpoints.close()
            self._producer.flush(self._ack_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
