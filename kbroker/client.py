"""The SDK: Service Broker's statements as methods of a Broker connected to one namespace.

    broker = kbroker.connect()
    handle = broker.begin_dialog(from_service, to_service, contract)
    broker.send(handle, message_type, body)
    for msg in broker.receive(queue, top=10, wait=5): ...
    broker.end_conversation(handle)

Outside a transaction each statement commits on its own, as in Service Broker: SEND returns once
Kafka acknowledged the message, RECEIVE commits the consumed offsets before it returns.
"""

from __future__ import annotations

import threading
from dataclasses import replace
import time
import uuid
from typing import Any, Callable, TypeVar
from xml.sax.saxutils import escape

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from . import config, names
from .config import KAFKA_LOG
from .catalog.models import Catalog
from .catalog.store import read_catalog
from .endpoints import (CLOSED, DISCONNECTED_INBOUND, DISCONNECTED_OUTBOUND, ERROR, MAX_LIFETIME,
                        SENDABLE, STARTED_OUTBOUND, Endpoint, EndpointStore, handle_for,
                        new_target_endpoint, other)
from .envelope import Envelope, Message
from .errors import (BrokerUnavailableError, CatalogError, ContractViolationError,
                     ConversationClosedError, MessageTooLargeError, QueueDisabledError,
                     SendFailedError, UnknownContractError)
from .receiver import QueueReader
from .validation import to_bytes, validate_body

SSB = "http://schemas.microsoft.com/SQL/ServiceBroker/"
END_DIALOG = SSB + "EndDialog"
ERROR_TYPE = SSB + "Error"
DIALOG_TIMER = SSB + "DialogTimer"
SYSTEM_TYPES = {END_DIALOG, ERROR_TYPE, DIALOG_TIMER}

T = TypeVar("T")


def error_body(code: int, description: str) -> bytes:
    """The body of Service Broker's Error message, so ported code parsing it keeps working."""
    return (f'<Error xmlns="{SSB}Error"><Code>{code}</Code>'
            f"<Description>{escape(description)}</Description></Error>").encode()


def connect(bootstrap: str | None = None, namespace: str | None = None, **kwargs: Any) -> "Broker":
    """Connect by the broker rule: explicit address, else KBROKER_BOOTSTRAP, else the embedded broker."""
    return Broker(config.resolve_bootstrap(bootstrap), config.namespace(namespace), **kwargs)


class Broker:
    def __init__(self, bootstrap: str, namespace: str, *, ack_timeout: float = 30.0):
        self.bootstrap, self.namespace = bootstrap, namespace
        self._ack_timeout = ack_timeout
        self._check_reachable()
        self._producer = Producer({
            "bootstrap.servers": bootstrap,
            "logger": KAFKA_LOG,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "message.max.bytes": 11 * 1024 * 1024,
        })
        self._lock = threading.RLock()
        self._errors: list[KafkaError] = []
        self._catalog: Catalog | None = None
        self.endpoints = EndpointStore(bootstrap, namespace, self._producer)
        self._readers: dict[str, QueueReader] = {}

    def _check_reachable(self) -> None:
        try:
            AdminClient({"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG}).list_topics(timeout=10)
        except Exception as exc:
            raise BrokerUnavailableError(f"no Kafka broker answers at {self.bootstrap}: {exc}") from None

    # --- catalog ----------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = read_catalog(self.bootstrap, self.namespace)
        return self._catalog

    def _lookup(self, fn: Callable[[Catalog], T]) -> T:
        """Catalog lookups re-read the catalog once before saying an object is unknown."""
        try:
            return fn(self.catalog)
        except CatalogError:
            self._catalog = read_catalog(self.bootstrap, self.namespace)
            return fn(self._catalog)

    # --- dialogs ----------------------------------------------------------------------------

    def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", *,
                     lifetime: int | None = None, related_conversation_group: str | None = None,
                     encryption: bool = False) -> str:
        """BEGIN DIALOG: creates the initiator endpoint and returns its conversation handle."""
        self._lookup(lambda c: c.service(from_service))
        self._lookup(lambda c: c.service(to_service))
        self._lookup(lambda c: c.contract(contract))
        if not self._lookup(lambda c: c.service_accepts(to_service, contract)):
            raise UnknownContractError(contract, to_service)
        if lifetime is not None and lifetime <= 0:
            raise ValueError("lifetime must be a positive number of seconds")
        conversation_id = str(uuid.uuid4())
        group = str(uuid.UUID(related_conversation_group)) if related_conversation_group else conversation_id
        expires = MAX_LIFETIME if lifetime is None else int(time.time()) + int(lifetime)
        ep = Endpoint(handle_for(conversation_id, "INITIATOR"), conversation_id, "INITIATOR", group,
                      conversation_id, from_service, to_service, contract, STARTED_OUTBOUND,
                      lifetime=expires)
        with self._lock:
            self.endpoints.put(ep)
            self._flush()
        return ep.conversation_handle

    def send(self, handle: str, message_type: str = "DEFAULT", body: bytes | str | dict | list | None = None,
             *, correlation_id: str | None = None, reply_to: str | None = None,
             time_to_be_received: float | None = None, priority: int = 5) -> str:
        """SEND ON CONVERSATION: returns the message id once Kafka acknowledged the message."""
        data = to_bytes(body)
        with self._lock:
            ep = self.endpoints.get(str(handle))
            if ep.state not in SENDABLE:
                raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
            if ep.lifetime < time.time():
                raise ConversationClosedError(ep.conversation_handle, "lifetime expired")
            mt = self._lookup(lambda c: c.message_type(message_type))
            if message_type in SYSTEM_TYPES or not self._lookup(
                    lambda c: c.may_send(ep.service_contract_name, message_type, ep.side)):
                raise ContractViolationError(message_type, ep.service_contract_name, ep.side)
            validate_body(message_type, mt.validation, data)
            expires = None if time_to_be_received is None else int((time.time() + time_to_be_received) * 1000)
            message_id = self._produce(ep, message_type, data, correlation_id=correlation_id,
                                       reply_to=reply_to, expires=expires, priority=priority)
            self.endpoints.put(ep.after_send())
            self._flush()
            return message_id

    def end_conversation(self, handle: str, *, error: int | None = None, description: str | None = None,
                         cleanup: bool = False) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP]."""
        with self._lock:
            ep = self.endpoints.get(str(handle))
            if cleanup:  # remove the local endpoint silently, as WITH CLEANUP does
                self._producer.produce(self.endpoints.topic, key=ep.conversation_handle, value=None)
                self.endpoints.forget(ep.conversation_handle)
                self._flush()
                return
            if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
                raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
            if error is not None and (not isinstance(error, int) or error <= 0):
                raise ValueError("error code must be a positive integer (negative codes are Service Broker's)")
            peer_listens = ep.state not in (DISCONNECTED_INBOUND, ERROR, STARTED_OUTBOUND)
            if peer_listens:
                if error is not None:
                    self._produce(ep, ERROR_TYPE, error_body(error, description or ""))
                else:
                    self._produce(ep, END_DIALOG, b"")
                ep = ep.after_send()
            # A dialog that never sent anything has no peer endpoint to wait for.
            ended = replace(ep, state=CLOSED) if ep.state == STARTED_OUTBOUND else ep.after_local_end()
            self.endpoints.put(ended)
            self._flush()

    # --- RECEIVE ----------------------------------------------------------------------------

    def receive(self, queue: str, top: int = 1, wait: float | None = 0.0, *,
                conversation_group: str | None = None, conversation_handle: str | None = None) -> list[Message]:
        """RECEIVE TOP(n) FROM queue [WHERE conversation_group_id | conversation_handle = ...],
        optionally inside WAITFOR(wait seconds; None waits without a time-out)."""
        if top < 1:
            raise ValueError("top must be at least 1")
        q = self._lookup(lambda c: c.queue(queue))
        if q.status != "ON":
            raise QueueDisabledError(queue)
        conversation_id = None
        if conversation_handle is not None:
            conversation_id = self.endpoints.get(str(conversation_handle)).conversation_id
        with self._lock:
            reader = self._readers.get(queue)
            if reader is None:
                reader = self._readers[queue] = QueueReader(
                    self.bootstrap, self.namespace, queue, dead_letter=self._dead_letter)
            msgs = reader.receive(top, wait, conversation_group=conversation_group,
                                  conversation_id=conversation_id)
            delivered = [m for m in msgs if self._track_received(m)]
            self._flush()  # endpoint changes and dead letters are durable before the offsets move
            reader.commit()
            return delivered

    def _track_received(self, msg: Message) -> bool:
        """Update this side's endpoint for a received message; False drops the message
        (it arrived after this side ended the conversation)."""
        env = msg.extra["envelope"]
        first_of_dialog = env.to_side == "TARGET" and env.message_sequence_number == 0
        # A dialog's first message creates the target endpoint: no lookup needed for it.
        ep = self.endpoints.cached(msg.conversation_handle) if first_of_dialog else \
            self.endpoints.find(msg.conversation_handle)
        if ep is None:
            if env.to_side != "TARGET":
                return True  # the initiator's endpoint was cleaned up or never stored here
            ep = new_target_endpoint(env.conversation_id, env.conversation_group_id, env.conversation_id,
                                     env.to_service_name, env.from_service_name, env.service_contract_name)
            self.endpoints.put(ep)
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED) and msg.message_type_name not in (END_DIALOG, ERROR_TYPE):
            return False
        if msg.message_type_name == END_DIALOG:
            self.endpoints.put(ep.after_peer_end())
        elif msg.message_type_name == ERROR_TYPE:
            self.endpoints.put(ep.after_peer_error())
        return True

    # --- plumbing ---------------------------------------------------------------------------

    def _produce(self, ep: Endpoint, message_type: str, data: bytes, *, correlation_id: str | None = None,
                 reply_to: str | None = None, expires: int | None = None, priority: int = 5) -> str:
        far_service = self._lookup(lambda c: c.service(ep.far_service_name))
        far_queue = self._lookup(lambda c: c.queue(far_service.queue))
        if len(data) > far_queue.max_message_bytes:
            raise MessageTooLargeError(len(data), far_queue.max_message_bytes, far_queue.name)
        env = Envelope(
            message_id=str(uuid.uuid4()), conversation_id=ep.conversation_id,
            conversation_group_id=ep.far_conversation_group_id,
            message_sequence_number=ep.send_sequence, message_type_name=message_type,
            service_contract_name=ep.service_contract_name, from_service_name=ep.service_name,
            to_service_name=ep.far_service_name, to_side=other(ep.side),
            correlation_id=correlation_id, reply_to=reply_to, expires=expires, priority=priority)
        self._producer.produce(names.queue_topic(self.namespace, far_queue.name),
                               key=env.conversation_group_id, value=data, headers=env.headers(),
                               on_delivery=self._on_delivery)
        return env.message_id

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

    def _dead_letter(self, record: Any, reason: str) -> None:
        headers = list(record.headers() or []) + [
            ("kb.dlq.reason", reason.encode()),
            ("kb.dlq.topic", record.topic().encode()),
            ("kb.dlq.partition", str(record.partition()).encode()),
            ("kb.dlq.offset", str(record.offset()).encode()),
        ]
        self._producer.produce(names.deadletter_topic(self.namespace), key=record.key(),
                               value=record.value(), headers=headers, on_delivery=self._on_delivery)

    def close(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
            self.endpoints.close()
            self._producer.flush(self._ack_timeout)

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
