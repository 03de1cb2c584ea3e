"""SEND's records: the statement's checks against the catalog and the endpoint, and the message
record every statement that sends writes (SEND, END CONVERSATION's EndDialog or Error, the Error
back for a message that came after its sender's end)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kbroker.core import names
from kbroker.core.catalog.models import END_DIALOG, ERROR, SYSTEM_TYPES
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    DISCONNECTED_INBOUND,
    DISCONNECTED_OUTBOUND,
    SENDABLE,
    STARTED_OUTBOUND,
    Endpoint,
    after_send,
    other,
)
from kbroker.core.dialogs.conversation_endpoint import ERROR as ERROR_STATE
from kbroker.core.dialogs.envelope import Envelope, error_body
from kbroker.core.dialogs.retained import retained_copy
from kbroker.core.dialogs.statement_base import StatementBase
from kbroker.core.dialogs.validation import to_bytes, validate_body
from kbroker.core.ids import new_id
from kbroker.core.records import Record
from kbroker.core.topic_limits import MAX_QUEUE_MESSAGE_BYTES
from kbroker.errors import (
    CatalogError,
    ContractViolationError,
    ConversationClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
)

SERVICE_DROPPED = -8470  # Service Broker's Error code for a dialog whose far service was dropped


class SendRecords(StatementBase):
    """SEND, and the message record of every statement that sends."""

    # --- SEND -----------------------------------------------------------------------------------

    def message_record(
        self,
        ep: Endpoint,
        message_type: str,
        body: Any = None,
        *,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        time_to_be_received: float | None = None,
        priority: int | None = None,
    ) -> tuple[Record, str, Endpoint]:
        """Validate a SEND and build its record: (record, message id, endpoint after the send)."""
        data = to_bytes(body)
        if ep.state not in SENDABLE:
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        if ep.lifetime is not None and ep.lifetime < self._clock():
            raise ConversationClosedError(ep.conversation_handle, "lifetime expired")
        mt = self._lookup(lambda c: c.message_type(message_type))
        if message_type in SYSTEM_TYPES or not self._lookup(
            lambda c: c.may_send(ep.service_contract_name, message_type, ep.side)
        ):
            raise ContractViolationError(message_type, ep.service_contract_name, ep.side)
        validate_body(message_type, mt.validation, data, self._lookup(lambda c: c.schema_collection_of(mt)))
        if priority is not None and (not isinstance(priority, int) or not 1 <= priority <= 10):
            raise InvalidArgumentError("priority must be 1-10")
        expires = None if time_to_be_received is None else int((self._clock() + time_to_be_received) * 1000)
        record, message_id = self._record(
            ep, message_type, data, correlation_id=correlation_id, reply_to=reply_to, expires=expires, priority=priority
        )
        return record, message_id, after_send(ep)

    def retains_sent(self, ep: Endpoint) -> bool:
        """Whether side `ep`'s queue is RETENTION = ON: it keeps a copy of what the side sends."""
        try:
            return self._lookup(lambda c: c.queue(c.service(ep.service_name).queue)).retention == "ON"
        except CatalogError:  # its service or queue dropped: SEND refuses it with its own error
            return False

    def retained_records(self, ep: Endpoint, sent: Record) -> list[Record]:
        """The copy of a SEND's record that side `ep`'s RETENTION = ON queue keeps (status 3,
        retained.py); none on a RETENTION = OFF queue."""
        return [retained_copy(sent, ep, self.own_topic(ep))] if self.retains_sent(ep) else []

    # --- DROP SERVICE -----------------------------------------------------------------------------

    def service_dropped_records(self, ep: Endpoint) -> tuple[list[Record], Endpoint]:
        """DROP SERVICE on one of the service's endpoints: the far side gets Service Broker's
        Error -8470 "Remote service has been dropped." (or, when it already ended or failed, the
        EndDialog that acknowledges it), and this side's endpoint is CLOSED and cleaned up, as
        END CONVERSATION WITH ERROR and then WITH CLEANUP would leave it."""
        closed = replace(ep, state=CLOSED, cleaned_up=True)
        if ep.state in (STARTED_OUTBOUND, DISCONNECTED_OUTBOUND, CLOSED):  # nothing the far side awaits
            return [], closed
        if ep.state in (DISCONNECTED_INBOUND, ERROR_STATE):
            record, _ = self._record(ep, END_DIALOG, b"")
        else:
            record, _ = self._record(ep, ERROR, error_body(SERVICE_DROPPED, "Remote service has been dropped."))
        return [record], replace(closed, send_sequence=ep.send_sequence + 1)

    # --- the message record ---------------------------------------------------------------------

    def _record(
        self,
        ep: Endpoint,
        message_type: str,
        data: bytes,
        *,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expires: int | None = None,
        priority: int | None = None,
    ) -> tuple[Record, str]:
        """A message from this side to the far side's queue, keyed by the far side's group, with
        this side's next sequence number: (record, message id). `priority`: SEND's, else the
        conversation's (Endpoint.send_priority)."""
        if not ep.remote:
            far_service = self._lookup(lambda c: c.service(ep.far_service_name))
            far_queue = self._lookup(lambda c: c.queue(far_service.queue))
            if len(data) > far_queue.max_message_bytes:
                raise MessageTooLargeError(len(data), far_queue.max_message_bytes, far_queue.name)
        elif len(data) > MAX_QUEUE_MESSAGE_BYTES:  # the far queue's own limit is checked where it arrives
            raise MessageTooLargeError(len(data), MAX_QUEUE_MESSAGE_BYTES, "the transmission topic")
        reply_group = ep.chain[0]  # the key the far side's records must carry (see groups.py)
        env = Envelope(
            message_id=new_id(),
            conversation_id=ep.conversation_id,
            conversation_group_id=ep.far_conversation_group_id,
            message_sequence_number=ep.send_sequence,
            message_type_name=message_type,
            service_contract_name=ep.service_contract_name,
            from_service_name=ep.service_name,
            to_service_name=ep.far_service_name,
            to_side=other(ep.side),
            correlation_id=correlation_id,
            reply_to=reply_to,
            expires=expires,
            priority=ep.send_priority if priority is None else priority,
            lifetime=ep.lifetime if ep.is_initiator else None,
            reply_group=None if reply_group == ep.conversation_id else reply_group,
            reply_instance=ep.instance,
            from_broker=self.namespace if ep.remote else None,
            to_broker=ep.far_broker,
            encryption=ep.remote and ep.encryption,
            session=ep.session if ep.remote else None,
        )
        if ep.remote:  # one dialog side's messages keep their order in one partition
            headers = env.headers()
            sealed = None if self.transmission_seal is None else self.transmission_seal(env, data)
            if sealed is not None:
                data = sealed[0]
                headers.append(sealed[1])
            return (names.transmission_topic(self.namespace), ep.conversation_handle, data, headers), env.message_id
        if ep.far_instance is not None:  # replies to an instance go to its secondary queue
            topic = names.secondary_queue_topic(self.namespace, far_queue.name, ep.far_instance)
        else:
            topic = names.queue_topic(self.namespace, far_queue.name)
        return (topic, env.conversation_group_id, data, env.headers()), env.message_id
