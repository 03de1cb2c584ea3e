"""Service Broker's process runtime: the shared one (sdk/process.py) plus what dialogs need of a
process. Its conversation endpoints (a cache over the endpoints topic), the statements that
build records, SEND's conversation locks and the leases that carry them across processes, the
receive hooks, poison-message counting, and the receivers of queues and secondary queues.

Broker (the statements a user calls) and Transaction both work through it; neither reaches into
the other."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from typing import Any

import orjson

from kbroker import metrics
from kbroker.core import names
from kbroker.core.catalog.models import Catalog, Queue
from kbroker.core.cluster import Cluster
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.locks import ConversationLocks
from kbroker.core.dialogs.sequence_reach import reach
from kbroker.core.dialogs.statements import Statements
from kbroker.core.receive.poison import PoisonCounter
from kbroker.core.records import Record
from kbroker.core.txn.commit_holder import transactional_id
from kbroker.errors import PermissionDeniedError, QueueDisabledError, QueueNameCollisionError
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
from kbroker.kafka.dialogs.group_holds import GroupHolds
from kbroker.kafka.dialogs.send_leases import SendLeases
from kbroker.kafka.queue_views import set_queue_status
from kbroker.kafka.receive.receiver import QueueReceiver
from kbroker.kafka.receive.rollbacks import RollbackLog
from kbroker.kafka.routing.keys import Keys
from kbroker.kafka.routing.sealing import TransmissionSeal
from kbroker.kafka.security.permissions import SendChecks
from kbroker.kafka.transport.secondary import ensure_secondary_queue
from kbroker.sdk.fresh_groups import FreshGroups
from kbroker.sdk.hooks import HookFanOut, ReceiveHooks
from kbroker.sdk.local_holds import LocalHolds
from kbroker.sdk.process import ProcessRuntime

log = logging.getLogger("kbroker.client")


class BrokerRuntime(ProcessRuntime):
    """The runtime of a process that speaks Service Broker in one namespace."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        *,
        ack_timeout: float = 30.0,
        commit_interval: float = 0.005,
        max_buffered: int = 20_000,
        revoke_grace: float = 5.0,
        lock_timeout: float = 30.0,
    ):
        # The committer's transactional ids are known before it starts: leases name them (fencing).
        super().__init__(
            cluster,
            namespace,
            ack_timeout=ack_timeout,
            commit_interval=commit_interval,
            transactional_ids=tuple(transactional_id(namespace, uuid.uuid4()) for _ in range(2)),
        )
        self._max_buffered, self._revoke_grace = max_buffered, revoke_grace
        self.conversation_locks = ConversationLocks(lock_timeout)  # SEND's (see locks.py)
        self.endpoints = EndpointStore(cluster, namespace, self.producer)
        self.statements = Statements(
            namespace, self.catalog.lookup, self.endpoints.in_group, sender_reach=self._sender_reach
        )
        # Routed dialogs' records sealed in the transmission topic when this machine holds the
        # namespace's master key (docs/security.md, "The transmission topic").
        self.statements.transmission_seal = TransmissionSeal(namespace, Keys()).seal
        self._unknown_reach_read = float("-inf")  # when _sender_reach last read for a side unknown here
        self._secondary: set[str] = set()  # secondary queue topics known to exist
        self._reported: set[str] = set()  # topics this process has an entry for in the readers topic
        self._rollbacks: RollbackLog | None = None  # every process's rollbacks; with the first receiver
        self._first_receive = threading.Lock()  # starts _rollbacks once
        self._poison = PoisonCounter()  # counts the queues this process reads itself
        self.hooks: list[ReceiveHooks] = []
        self.receive_hooks: ReceiveHooks = HookFanOut(self.hooks)
        self.send_checks = SendChecks(cluster)
        self.send_leases = SendLeases(
            cluster,
            self.endpoints,
            self.conversation_locks,
            self.process,
            lambda: self._transactional_ids,
            ack_timeout=ack_timeout,
        ).start()
        # The group lock across processes (sdk/group_locks.py); its thread starts on first use.
        self.group_holds = GroupHolds(cluster, namespace, self.process, catch_up=self.endpoints.caught_up)
        self.fresh_groups = FreshGroups()
        self.local_holds = LocalHolds()  # the groups locked by name here, kept in the receivers too

    # --- SEND's permission ----------------------------------------------------------------------

    def check_send(self, ep: Endpoint, records: list[Record] | None = None) -> None:
        """BEGIN DIALOG (no `records`: the far service's queue) or a statement's records to the
        far side: SendPermissionDeniedError (-8494) before any of it is written, unless this
        process's principal may WRITE the queue topics they go to. A routed dialog's far
        namespace decides for itself."""
        if ep.remote:
            return
        topics = (
            {names.queue_topic(self.namespace, self.statements.queue_of(ep.far_service_name))}
            if records is None
            else {r[0] for r in records}
        )
        for topic in sorted(topics):
            if names.queue_of_topic(self.namespace, topic) is not None:
                self.send_checks.check(ep.far_service_name, topic)

    # --- queues -------------------------------------------------------------------------------

    def open_queue(self, queue: str) -> tuple[Catalog, Queue]:
        """The catalog and `queue` in it, for one RECEIVE: QueueDisabledError unless STATUS = ON.
        A disabled queue is checked against the catalog read again, so an ALTER QUEUE ... STATUS =
        ON from any process is seen on the next RECEIVE."""
        if self._follow_rollbacks().disabled(queue):
            raise QueueDisabledError(queue)  # a poison verdict the catalog could not take
        catalog = self.catalog.current
        q = catalog.queues.get(queue)
        if q is None or q.status != "ON" or queue in self.catalog.disabled:
            catalog = self.catalog.refresh()
            q = catalog.queue(queue)  # UnknownQueueError
            if q.status != "ON":
                raise QueueDisabledError(queue)
            self.catalog.disabled.discard(queue)
            self._poison.reset(queue)
        return catalog, q

    def queue_enabled(self, queue: str) -> bool:
        """Whether `queue` has STATUS = ON (see open_queue)."""
        try:
            self.open_queue(queue)
        except QueueDisabledError:
            return False
        return True

    def queue_open(self, queue: str) -> bool:
        """STATUS of `queue` as known now, without reading Kafka (checked while a RECEIVE waits)."""
        return self.catalog.is_open(queue)

    def queue_topic_of(self, queue: str, instance: str | None) -> str:
        """The topic `queue`'s messages for `instance` (None: any) are read from."""
        if instance is None:
            return names.queue_topic(self.namespace, self.catalog.queue(queue).name)
        return names.secondary_queue_topic(self.namespace, self.catalog.queue(queue).name, instance)

    def receiver(self, queue: str, instance: str | None = None) -> QueueReceiver:
        """The receiver of `queue`, or of its secondary queue for `instance`."""
        return self.receiver_for((queue, instance), functools.partial(self._new_receiver, queue, instance))

    def _new_receiver(self, queue: str, instance: str | None) -> QueueReceiver:
        q = self.catalog.queue(queue)
        topic = None if instance is None else self.secondary_queue(q.name, instance)
        r = QueueReceiver(
            self.cluster,
            self.namespace,
            queue,
            dead_letter=self.dead_letter,
            max_buffered=self._max_buffered,
            revoke_grace=self._revoke_grace,
            commit_barrier=self.committer.barrier,
            topic=topic,
            committer_ids=self.committer.transactional_ids,
            # A partition that arrives may hold records of conversations moved by another
            # process since this one cached their endpoints: catch up first.
            on_assign=self.endpoints.refresh,
            # The holds of other processes on groups of its partitions (sdk/group_locks.py).
            on_owned=lambda partitions: self._owned(q.name, instance, r, partitions),
            on_disowned=lambda partitions: self.group_holds.disowned(q.name, instance, partitions),
            report=functools.partial(self._report_reader, queue),
        )
        r.start()
        if instance is None:
            self._poison.watch(queue)  # poison counting covers the queues read here
        self._follow_rollbacks()
        return r

    def _owned(self, queue: str, instance: str | None, r: QueueReceiver, partitions: list[int]) -> None:
        """A receiver was given `partitions`: this process's own named locks first, then the
        holds of other processes on groups there (sdk/group_locks.py), before it serves them."""
        self.local_holds.owned(queue, instance, r, partitions)
        self.group_holds.owned(queue, instance, r, partitions)

    def _follow_rollbacks(self) -> RollbackLog:
        """The events a reading process follows: other processes' rollbacks and the poison verdicts
        the catalog could not take; and the catalog watcher (ALTER QUEUE within 0.5 s)."""
        if self._rollbacks is None:
            # Once: the first RECEIVEs of many readers arrive together, and each would start a
            # follower of its own (consumers left running) without the lock.
            with self._first_receive:
                if self._rollbacks is None:
                    self.catalog.watch()
                    self._rollbacks = RollbackLog(self.cluster, self.namespace, self.producer, self.process).start()
        return self._rollbacks

    def secondary_queue(self, queue: str, instance: str) -> str:
        """The secondary queue topic of `queue` for `instance`, created on first use."""
        topic = names.secondary_queue_topic(self.namespace, queue, instance)
        with self._lock:
            if topic not in self._secondary:
                q = self.catalog.queue(queue)
                # A catalog applied before apply refused colliding names may still hold them.
                clash = names.secondary_queue_collision(self.namespace, self.catalog.current.queues, q.name, instance)
                if clash is not None:
                    raise QueueNameCollisionError(
                        f"the secondary queue of {queue} for instance {instance!r}", f"queue {clash[0]!r}", clash[1]
                    )
                ensure_secondary_queue(self.cluster, self.namespace, q, instance)
                self._secondary.add(topic)
        return topic

    def _report_reader(self, queue: str, stats: dict[str, Any]) -> None:
        """Every few seconds, from a receiver's poll thread: its locks and in-flight counts, for
        `kbroker queue show` (a compacted topic keyed by process and topic; fire and forget)."""
        self._publish_reader(
            stats["topic"], orjson.dumps({**stats, "queue": queue, "process": self.process, "at": time.time()})
        )

    def _publish_reader(self, topic: str, value: bytes | None) -> None:
        """This process's entry for `topic` in the readers topic (None: it no longer reads it;
        written only over an entry this process wrote, so a refused reader writes nothing)."""
        if value is None:
            if topic not in self._reported:
                return
            self._reported.discard(topic)
        else:
            self._reported.add(topic)
        try:
            self.producer.produce(names.readers_topic(self.namespace), key=f"{self.process}/{topic}", value=value)
        except Exception:  # BufferError (local queue full) or KafkaException: a view, not data, so skip it
            log.debug("reader report for %s skipped", topic, exc_info=True)

    # --- poison-message handling --------------------------------------------------------------

    def note_commit(self, queue: str, taken: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """A transaction that received from `queue` committed: its poison count starts over, and
        the messages it received need no rollback count any more."""
        self._poison.reset(queue)
        if self._rollbacks is not None:
            for topic, offsets in (taken or {}).items():
                self._rollbacks.committed(topic, offsets)

    def note_rollback(self, queue: str, taken: dict[str, list[tuple[int, int]]] | None = None) -> None:
        """Five rolled-back receives in a row (this process), or five rollbacks of one message
        (any process), disable the queue (core/receive/poison.py)."""
        metrics.of(metrics.ROLLBACKS, self.namespace, queue).inc()
        if not self._poison.watches(queue):
            return
        handling = self.catalog.queue(queue).poison_message_handling == "ON"
        verdict = self._poison.rolled_back(queue, handling)
        if self._rollbacks is not None:
            for topic, offsets in (taken or {}).items():
                counts = self._rollbacks.rolled_back(queue, topic, offsets)
                verdict = verdict or self._rollbacks.ledger.verdict(queue, counts, handling)
        if verdict is not None:
            metrics.of(metrics.POISON_DISABLES, self.namespace, verdict.queue).inc()
            self.catalog.disabled.add(verdict.queue)
            try:
                set_queue_status(self.cluster, self.namespace, verdict.queue, "OFF", verdict.reason, poison=True)
            except PermissionDeniedError as exc:
                # Only the catalog's owner and ALTER's holders write the catalog (G7): the verdict
                # goes on the events topic, which every reader follows, until `queue enable`.
                log.error(
                    "queue %s: %s; disabled by an event, the catalog not being this principal's (%s)",
                    verdict.queue,
                    verdict.reason,
                    exc,
                )
                assert self._rollbacks is not None  # made with the receiver whose rollback this is
                self._rollbacks.publish_disabled(verdict.queue, verdict.reason)
                return
            self.catalog.refresh()

    # --- sequence numbers ---------------------------------------------------------------------

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

    # --- lifecycle ----------------------------------------------------------------------------

    def _receiver_closed(self, receiver: QueueReceiver) -> None:
        self._publish_reader(receiver.topic, None)  # no longer read here: drop it from the view

    def close(self) -> None:
        """Stop reading, commit what is pending, write the exact send sequences, and flush."""
        with self._lock:
            super().close()
            if self._rollbacks is not None:
                self._rollbacks.close()
                self._rollbacks = None
            self._poison.forget_all()
            self.endpoints.write_unwritten()  # exact sequences, so a restart leaves no gap
            self.send_leases.close()  # other processes need not wait for the leases to run out
            self.group_holds.close()
            self.endpoints.close()
            self.producer.flush(self.ack_timeout)
