"""The SDK: Service Broker's statements as methods of a Broker connected to one namespace.

    broker = kbroker.connect()
    handle = broker.begin_dialog(from_service, to_service, contract)
    broker.send(handle, message_type, body)
    with broker.transaction() as tx:
        for msg in tx.receive(queue, top=10, wait=5): ...

Outside a transaction each statement commits on its own, as in Service Broker: SEND returns once
Kafka acknowledged the message (idempotent producer), and RECEIVE is a transaction of its own.
The methods building records are shared by both paths, so a statement validates the same way
inside and outside a transaction.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, TypeVar

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from kbroker import config
from kbroker.config import KAFKA_LOG
from kbroker.core import names, timers
from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG, Catalog
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.endpoint import (
    CLOSED,
    DISCONNECTED_INBOUND,
    DISCONNECTED_OUTBOUND,
    ERROR,
    MAX_LIFETIME,
    SENDABLE,
    STARTED_OUTBOUND,
    Endpoint,
    after_send,
    chain_key,
    handle_for,
    must_persist,
    new_target_endpoint,
    other,
)
from kbroker.core.envelope import SYSTEM_SEQUENCE, Envelope, Message, error_body
from kbroker.core.groups import MOVE_MARKER, moved, parse_group, rekeyed_headers
from kbroker.core.ids import new_id
from kbroker.core.locks import ConversationLocks
from kbroker.core.records import Record
from kbroker.core.validation import to_bytes, validate_body
from kbroker.embedded import resolve_bootstrap
from kbroker.errors import (
    BrokerUnavailableError,
    CatalogError,
    ContractViolationError,
    ConversationClosedError,
    ConversationGroupError,
    MessageTooLargeError,
    SendFailedError,
    UnknownContractError,
)
from kbroker.kafka.catalog_store import read_catalog
from kbroker.kafka.committer import CommitRequest, GroupCommitter, OpenTransactions
from kbroker.kafka.endpoint_store import EndpointStore
from kbroker.kafka.receiver import QueueReceiver
from kbroker.kafka.secondary import ensure_secondary_queue
from kbroker.sdk.transaction import Transaction

SYSTEM_TYPES = {END_DIALOG, ERROR_TYPE, DIALOG_TIMER}
log = logging.getLogger("kbroker.client")
POISON_THRESHOLD = 5  # consecutive rolled-back receives that disable a queue, as in Service Broker

T = TypeVar("T")


def connect(bootstrap: str | None = None, namespace: str | None = None, **kwargs: Any) -> "Broker":
    """Connect by the broker rule: explicit address, else KBROKER_BOOTSTRAP, else the embedded broker."""
    return Broker(resolve_bootstrap(bootstrap), config.namespace(namespace), **kwargs)


class Broker:
    def __init__(self, bootstrap: str, namespace: str, *, ack_timeout: float = 30.0,
                 commit_interval: float = 0.005, max_buffered: int = 20_000, revoke_grace: float = 5.0,
                 lock_timeout: float = 30.0):
        self.bootstrap, self.namespace = bootstrap, namespace
        self._ack_timeout = ack_timeout
        self._commit_interval = commit_interval
        self._max_buffered, self._revoke_grace = max_buffered, revoke_grace
        self._check_reachable()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "logger": KAFKA_LOG,
            "enable.idempotence": True, "acks": "all", "linger.ms": 1,
            "message.max.bytes": 11 * 1024 * 1024,
        })
        self._lock = threading.RLock()
        self._errors: list[KafkaError] = []
        self._catalog: Catalog | None = None
        self._committer: GroupCommitter | None = None
        self.open_transactions = OpenTransactions()
        self.conversation_locks = ConversationLocks(lock_timeout)  # SEND's (see locks.py)
        self.endpoints = EndpointStore(bootstrap, namespace, self._producer)
        self._receivers: dict[tuple[str, str | None], QueueReceiver] = {}  # (queue, instance)
        self._secondary: set[str] = set()  # secondary queue topics known to exist
        self._disabled: set[str] = set()
        self.hooks: list[Any] = []  # objects with before_receive / after_receive / after_rollback
        self._process = f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:04x}"  # in reader reports

    def emit(self, hook: str, *args: Any) -> None:
        """Call `hook` on every registered hook object that has it (the worker's queue monitors
        learn of RECEIVEs this way). A failing hook is logged, never raised into the statement."""
        for h in self.hooks:
            fn = getattr(h, hook, None)
            if fn is not None:
                try:
                    fn(*args)
                except Exception:
                    log.exception("hook %s of %r failed", hook, h)

    def _check_reachable(self) -> None:
        try:
            AdminClient({"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG}).list_topics(timeout=10)
        except Exception as exc:
            raise BrokerUnavailableError(f"no Kafka broker answers at {self.bootstrap}: {exc}") from None

    # --- catalog ------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = read_catalog(self.bootstrap, self.namespace)
        return self._catalog

    def refresh_catalog(self) -> Catalog:
        self._catalog = read_catalog(self.bootstrap, self.namespace)
        return self._catalog

    def _lookup(self, fn: Callable[[Catalog], T]) -> T:
        """Catalog lookups re-read the catalog once before saying an object is unknown."""
        try:
            return fn(self.catalog)
        except CatalogError:
            return fn(self.refresh_catalog())

    def queue_enabled(self, queue: str) -> bool:
        """STATUS of a queue. A disabled one is re-checked against the catalog, so an
        ALTER QUEUE ... STATUS = ON from any process is seen on the next RECEIVE."""
        q = self._lookup(lambda c: c.queue(queue))
        if q.status == "ON" and queue not in self._disabled:
            return True
        q = self.refresh_catalog().queue(queue)
        if q.status == "ON":
            self._disabled.discard(queue)
            receiver = self._receivers.get((queue, None))
            if receiver is not None:
                receiver.consecutive_rollbacks = 0
            return True
        return False

    # --- the runtime --------------------------------------------------------------------------

    @property
    def committer(self) -> GroupCommitter:
        with self._lock:
            if self._committer is None:
                self._committer = GroupCommitter(self.bootstrap, self.namespace, interval=self._commit_interval,
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
                    self.bootstrap, self.namespace, queue, dead_letter=self._dead_letter,
                    max_buffered=self._max_buffered, revoke_grace=self._revoke_grace,
                    commit_barrier=committer.barrier, topic=topic,
                    # A partition that arrives may hold records of conversations moved by another
                    # process since this one cached their endpoints: catch up first.
                    on_assign=self.endpoints.refresh,
                    report=lambda stats, q=queue: self._report_reader(q, stats)).start()
            return r

    def _report_reader(self, queue: str, stats: dict) -> None:
        """Every few seconds, from a receiver's poll thread: its locks and in-flight counts, for
        `kbroker queue show` (a compacted topic keyed by process and topic; fire and forget)."""
        self._publish_reader(stats["topic"], orjson.dumps(
            {**stats, "queue": queue, "process": self._process, "at": time.time()}))

    def _publish_reader(self, topic: str, value: bytes | None) -> None:
        """This process's entry for `topic` in the readers topic (None: it no longer reads it)."""
        try:
            self._producer.produce(names.readers_topic(self.namespace), key=f"{self._process}/{topic}", value=value)
        except (BufferError, KafkaException):
            pass  # a view, not data: skip this report

    def secondary_queue(self, queue: str, instance: str) -> str:
        """The secondary queue topic of `queue` for `instance`, created on first use."""
        topic = names.secondary_queue_topic(self.namespace, queue, instance)
        with self._lock:
            if topic not in self._secondary:
                q = self._lookup(lambda c: c.queue(queue))
                ensure_secondary_queue(self.bootstrap, self.namespace, q, instance)
                self._secondary.add(topic)
        return topic

    def transaction(self) -> Transaction:
        """BEGIN TRANSACTION: use as a context manager, or call commit()/rollback()."""
        return Transaction(self)

    def note_commit(self, queue: str) -> None:
        r = self._receivers.get((queue, None))
        if r is not None:
            r.consecutive_rollbacks = 0

    def note_rollback(self, queue: str) -> None:
        """Poison-message handling: five rolled-back receives in a row disable the queue."""
        r = self._receivers.get((queue, None))
        if r is None:
            return
        r.consecutive_rollbacks += 1
        q = self._lookup(lambda c: c.queue(queue))
        if r.consecutive_rollbacks >= POISON_THRESHOLD and q.poison_message_handling == "ON":
            from kbroker.kafka.queues import set_queue_status

            self._disabled.add(queue)
            set_queue_status(self.bootstrap, self.namespace, queue, "OFF",
                             f"{r.consecutive_rollbacks} consecutive rolled-back receives", poison=True)
            self.refresh_catalog()

    # --- statements outside a transaction -----------------------------------------------------

    def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG: creates the initiator endpoint and returns its conversation handle."""
        ep = self.new_dialog(from_service, to_service, contract, **kw)
        with self._lock:
            for record in self.lifetime_records(ep):
                self._produce(record)
            self.endpoints.put(ep)
            self._flush()
        return ep.conversation_handle

    def send(self, handle: str, message_type: str = "DEFAULT", body: Any = None, **kw: Any) -> str:
        """SEND ON CONVERSATION: returns the message id once Kafka acknowledged the message."""
        with self.conversation_locks.held(str(handle)), self._lock:
            before = self.endpoints.get(str(handle))
            record, message_id, ep = self.message_record(before, message_type, body, **kw)
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
        with self.conversation_locks.held(str(handle)), self._lock:
            ep = self.endpoints.get(str(handle))
            records, ended = self.end_records(ep, error=error, description=description, cleanup=cleanup)
            for record in records:
                self._produce(record)
            self._produce(self.endpoint_record(ep.conversation_handle, ended))
            self.endpoints.note(ep.conversation_handle, ended)
            self._flush()

    def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds: a DialogTimer message reaches this
        side's queue then (fired by the timer service, which `kbroker worker` runs)."""
        with self.conversation_locks.held(str(handle)), self._lock:
            records, ep = self.timer_records(self.endpoints.get(str(handle)), timeout)
            for record in records:
                self._produce(record)
            self.endpoints.put(ep)
            self._flush()

    def receive(self, queue: str, top: int = 1, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        """RECEIVE outside a transaction: a transaction of its own, committed before it returns."""
        with self.transaction() as tx:
            return tx.receive(queue, top, wait, **kw)

    def queue_messages(self, queue: str, conversation_handle: str | None = None) -> list[dict]:
        """The queue's messages like Service Broker's queue view: status 1 = ready, 0 = received
        (listed only with RETENTION = ON, until this side ends the conversation). See retention.py."""
        from kbroker.kafka.retention import queue_messages

        return queue_messages(self.bootstrap, self.namespace, queue, conversation_handle)

    def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group, committed before it returns."""
        with self.transaction() as tx:
            tx.move_conversation(handle, group)

    # --- building records (shared by both paths) ----------------------------------------------

    def new_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", *,
                   lifetime: int | None = None, related_conversation_group: str | None = None,
                   related_conversation: str | None = None, encryption: bool = False,
                   instance: str | None = None,
                   endpoint_of: Callable[[str], Endpoint] | None = None) -> Endpoint:
        """The initiator endpoint of a new dialog. RELATED_CONVERSATION (a handle, looked up with
        `endpoint_of`) or RELATED_CONVERSATION_GROUP (a GUID, new or existing) choose its group;
        `instance` sends the replies to that instance's secondary queue."""
        fs = self._lookup(lambda c: c.service(from_service))
        self._lookup(lambda c: c.service(to_service))
        self._lookup(lambda c: c.contract(contract))
        if not self._lookup(lambda c: c.service_accepts(to_service, contract)):
            raise UnknownContractError(contract, to_service)
        if lifetime is not None and lifetime <= 0:
            raise ValueError("lifetime must be a positive number of seconds")
        if related_conversation is not None and related_conversation_group is not None:
            raise ValueError("give RELATED_CONVERSATION or RELATED_CONVERSATION_GROUP, not both")
        conversation_id = new_id()
        group = conversation_id
        if related_conversation is not None:
            related = (endpoint_of or self.endpoints.get)(str(related_conversation))
            group = related.conversation_group_id
            other_queue = self._lookup(lambda c: c.service(related.service_name)).queue
            if other_queue != fs.queue:
                raise ConversationGroupError(group, fs.queue, other_queue)
        elif related_conversation_group is not None:
            group = parse_group(related_conversation_group)
            self.check_group_queue(group, fs.queue)
        if instance is not None:
            self.secondary_queue(fs.queue, instance)  # the target's replies need it to exist
        expires = MAX_LIFETIME if lifetime is None else int(time.time()) + int(lifetime)
        return Endpoint(handle_for(conversation_id, "INITIATOR"), conversation_id, "INITIATOR", group,
                        conversation_id, from_service, to_service, contract, STARTED_OUTBOUND,
                        lifetime=expires, updated=time.time(), instance=instance)

    def check_group_queue(self, group: str, queue: str, *, ignore: str | None = None) -> None:
        """Groups are local to a queue: refuse a group that only conversations of another queue
        use. (A dialog id is the default group of both its sides, so one id may be a group on
        two queues; it is then this queue's group too.)"""
        others = set()
        for ep in self.endpoints.all():
            if ep.conversation_group_id == group and ep.conversation_handle != ignore and ep.state != CLOSED:
                other_queue = self._lookup(lambda c: c.service(ep.service_name)).queue
                if other_queue == queue:
                    return
                others.add(other_queue)
        if others:
            raise ConversationGroupError(group, queue, sorted(others)[0])

    def move_records(self, ep: Endpoint, group: str) -> tuple[Endpoint, list[Record]]:
        """MOVE CONVERSATION: this side's endpoint after the move, and the marker record that
        tells the old group's reader where the move happened (see groups.py)."""
        group = parse_group(group)
        queue = self._lookup(lambda c: c.service(ep.service_name)).queue
        self.check_group_queue(group, queue, ignore=ep.conversation_handle)
        new, needs_marker = moved(ep, group)
        if not needs_marker:
            return new, []
        old = ep.conversation_group_id
        env = Envelope(message_id=new_id(), conversation_id=ep.conversation_id,
                       conversation_group_id=old, message_sequence_number=SYSTEM_SEQUENCE,
                       message_type_name=MOVE_MARKER, service_contract_name=ep.service_contract_name,
                       from_service_name=ep.service_name, to_service_name=ep.service_name, to_side=ep.side,
                       hop=len(ep.chain) - 1)
        chain = orjson.dumps(list(new.chain))
        return new, [(self.own_topic(ep), old, chain, env.headers()),
                     (self.endpoints.topic, chain_key(ep.conversation_handle), chain, None)]

    def own_topic(self, ep: Endpoint) -> str:
        """The topic this side of a conversation receives from."""
        return self._queue_topic_of(ep.service_name, ep.instance)

    def message_record(self, ep: Endpoint, message_type: str, body: Any = None, *,
                       correlation_id: str | None = None, reply_to: str | None = None,
                       time_to_be_received: float | None = None, priority: int = 5) -> tuple[Record, str, Endpoint]:
        """Validate a SEND and build its record: (record, message id, endpoint after the send)."""
        data = to_bytes(body)
        if ep.state not in SENDABLE:
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        if ep.lifetime < time.time():
            raise ConversationClosedError(ep.conversation_handle, "lifetime expired")
        mt = self._lookup(lambda c: c.message_type(message_type))
        if message_type in SYSTEM_TYPES or not self._lookup(
                lambda c: c.may_send(ep.service_contract_name, message_type, ep.side)):
            raise ContractViolationError(message_type, ep.service_contract_name, ep.side)
        validate_body(message_type, mt.validation, data)
        if not 1 <= priority <= 10:
            raise ValueError("priority must be 1-10")
        expires = None if time_to_be_received is None else int((time.time() + time_to_be_received) * 1000)
        record, message_id = self._record(ep, message_type, data, correlation_id=correlation_id,
                                          reply_to=reply_to, expires=expires, priority=priority)
        return record, message_id, after_send(ep)

    def end_records(self, ep: Endpoint, *, error: int | None, description: str | None,
                    cleanup: bool) -> tuple[list[Record], Endpoint | None]:
        """END CONVERSATION's records and the endpoint after it (None: removed by CLEANUP)."""
        if cleanup:  # remove the local endpoint silently, as WITH CLEANUP does
            return [], None
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        if error is not None and (not isinstance(error, int) or error <= 0):
            raise ValueError("error code must be a positive integer (negative codes are Service Broker's)")
        if ep.state == STARTED_OUTBOUND:  # never sent anything: no peer endpoint to tell
            return [], replace(ep, state=CLOSED)
        # After the peer ended (DI) or failed (ER), the EndDialog sent here is the acknowledgement
        # that moves the peer's DISCONNECTED_OUTBOUND endpoint to CLOSED; its app never sees it.
        peer_done = ep.state in (DISCONNECTED_INBOUND, ERROR)
        body = error_body(error, description or "") if error is not None and not peer_done else b""
        rec, _ = self._record(ep, ERROR_TYPE if body else END_DIALOG, body)
        return [rec], ep.after_send().after_local_end()

    def timer_records(self, ep: Endpoint, timeout: float) -> tuple[list[Record], Endpoint]:
        """BEGIN CONVERSATION TIMER's records: the new arm, and the old one's tombstone (one timer
        per side; arming again replaces it)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_LIFETIME:
            raise ValueError(f"timer timeout must be 0 < seconds <= {MAX_LIFETIME}, not {timeout!r}")
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        arm_id, due = uuid.uuid4().hex[:16], time.time() + float(timeout)
        records = [r for r in [timers.disarm_record(self.namespace, ep)] if r is not None]
        records.append(timers.arm_record(self.namespace, ep, arm_id, due,
                                         self.own_topic(ep)))
        return records, replace(ep, dialog_timer=due, dialog_timer_id=arm_id)

    def lifetime_records(self, ep: Endpoint) -> list[Record]:
        """BEGIN DIALOG ... LIFETIME: the timer that delivers Error -8489 to both sides."""
        if ep.lifetime >= MAX_LIFETIME:
            return []
        return [timers.lifetime_record(self.namespace, ep, self.own_topic(ep),
                                       self._queue_topic_of(ep.far_service_name, None))]

    def _queue_topic_of(self, service: str, instance: str | None) -> str:
        """Where messages for `service` land: its queue, or that queue's secondary queue."""
        queue = self._lookup(lambda c: c.service(service)).queue
        if instance is not None:
            return names.secondary_queue_topic(self.namespace, queue, instance)
        return names.queue_topic(self.namespace, queue)

    def endpoint_record(self, handle: str, ep: Endpoint | None) -> Record:
        return (self.endpoints.topic, handle, None if ep is None else ep.to_json(), None)

    def receiving_endpoint(self, msg: Message, staged: Endpoint | None) -> Endpoint | None:
        """This side's endpoint for a received message, if it exists yet."""
        env = msg.extra["envelope"]
        # A dialog's first message finds no target endpoint: no need to read the topic for it.
        first_of_dialog = env.to_side == "TARGET" and env.message_sequence_number == 0 and env.hop == 0
        return staged or (self.endpoints.cached(msg.conversation_handle) if first_of_dialog
                          else self.endpoints.find(msg.conversation_handle))

    def note_move(self, marker: Message) -> Endpoint | None:
        """A move marker came by: update the cached endpoint if this process missed the move."""
        ep = self.endpoints.find(marker.conversation_handle)
        if ep is None:
            return None
        ep = ep.with_chain(tuple(orjson.loads(marker.body)))
        self.endpoints.note(marker.conversation_handle, ep)
        return ep

    def rekey_record(self, topic: str, msg: Message, group: str) -> Record:
        """The record that carries a moved conversation's message one hop along its group chain."""
        env = msg.extra["envelope"]
        origin = f"{msg.partition}:{msg.offset}"
        headers = rekeyed_headers(msg.extra["record"].headers() or [], group, env.hop + 1, origin)
        return (topic, group, msg.body, headers)

    def after_receive(self, msg: Message, ep: Endpoint | None) -> tuple[bool, Endpoint | None]:
        """This side's endpoint after receiving `msg`: (deliver it?, endpoint to stage). `ep` is
        what receiving_endpoint found (None: it does not exist here)."""
        env = msg.extra["envelope"]
        created = None
        if ep is None:
            if env.to_side != "TARGET":
                return True, None  # the initiator's endpoint was cleaned up or never stored here
            # A dialog's first message creates the target endpoint, as in Service Broker; its
            # replies carry the key the initiator asked for (its related group, if any).
            ep = created = new_target_endpoint(env.conversation_id, env.conversation_group_id,
                                               env.reply_group or env.conversation_id, env.to_service_name,
                                               env.from_service_name, env.service_contract_name,
                                               far_instance=env.reply_instance, lifetime=env.lifetime)
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            # This side already ended: the peer's EndDialog or Error only closes the endpoint
            # (Service Broker's end-of-dialog acknowledgement); anything else is discarded.
            if ep.state == DISCONNECTED_OUTBOUND and msg.message_type_name in (END_DIALOG, ERROR_TYPE):
                return False, replace(ep, state=CLOSED)
            return False, None
        if msg.message_type_name == END_DIALOG:
            return True, ep.after_peer_end()
        if msg.message_type_name == ERROR_TYPE:
            return True, ep.after_peer_error()
        return True, created

    def _record(self, ep: Endpoint, message_type: str, data: bytes, *, correlation_id: str | None = None,
                reply_to: str | None = None, expires: int | None = None, priority: int = 5) -> tuple[Record, str]:
        far_service = self._lookup(lambda c: c.service(ep.far_service_name))
        far_queue = self._lookup(lambda c: c.queue(far_service.queue))
        if len(data) > far_queue.max_message_bytes:
            raise MessageTooLargeError(len(data), far_queue.max_message_bytes, far_queue.name)
        reply_group = ep.chain[0]  # the key the far side's records must carry (see groups.py)
        env = Envelope(
            message_id=new_id(), conversation_id=ep.conversation_id,
            conversation_group_id=ep.far_conversation_group_id,
            message_sequence_number=ep.send_sequence, message_type_name=message_type,
            service_contract_name=ep.service_contract_name, from_service_name=ep.service_name,
            to_service_name=ep.far_service_name, to_side=other(ep.side),
            correlation_id=correlation_id, reply_to=reply_to, expires=expires, priority=priority,
            lifetime=ep.lifetime if ep.is_initiator and ep.lifetime < MAX_LIFETIME else None,
            reply_group=None if reply_group == ep.conversation_id else reply_group,
            reply_instance=ep.instance)
        if ep.far_instance is not None:  # replies to an instance go to its secondary queue
            topic = names.secondary_queue_topic(self.namespace, far_queue.name, ep.far_instance)
        else:
            topic = names.queue_topic(self.namespace, far_queue.name)
        return (topic, env.conversation_group_id, data, env.headers()), env.message_id

    # --- plumbing -----------------------------------------------------------------------------

    def _produce(self, record: Record) -> None:
        topic, key, value, headers = record
        self._producer.produce(topic, key=key, value=value, headers=headers, on_delivery=self._on_delivery)

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
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
        together, without waiting (the poll thread never waits on a commit)."""
        headers = list(record.headers() or []) + [
            ("kb.dlq.reason", reason.encode()), ("kb.dlq.topic", record.topic().encode()),
            ("kb.dlq.partition", str(record.partition()).encode()),
            ("kb.dlq.offset", str(record.offset()).encode()),
        ]
        rec = (names.deadletter_topic(self.namespace), record.key(), record.value(), headers)
        self.committer.submit(CommitRequest([rec], [receiver.dead_letter_lease(record)]))

    def close(self) -> None:
        with self._lock:
            for r in self._receivers.values():
                r.close()
                self._publish_reader(r.topic, None)  # no longer read here: drop it from the view
            self._receivers.clear()
            if self._committer is not None:
                self._committer.close()
                self._committer = None
            self.endpoints.write_unwritten()  # exact sequences, so a restart leaves no gap
            self.endpoints.close()
            self._producer.flush(self._ack_timeout)

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
