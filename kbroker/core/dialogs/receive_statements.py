"""What a RECEIVE does to this side's endpoint, as records: the endpoint a message creates or
moves on, and the messages it must not deliver (refused on arrival, for a CLOSED endpoint, sent
after the peer's end), each set aside as a dead letter with its event."""

from __future__ import annotations

from dataclasses import replace

from kbroker.core.catalog.models import END_DIALOG, SYSTEM_TYPES, Catalog
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dead_letter import dead_letter_record
from kbroker.core.dialogs.arrival import too_large_reason
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    DISCONNECTED_INBOUND,
    DISCONNECTED_OUTBOUND,
    ERROR,
    Endpoint,
    handle_for,
    new_target_endpoint,
    other,
)
from kbroker.core.dialogs.envelope import Envelope, Message, error_body
from kbroker.core.dialogs.groups import rekeyed_headers
from kbroker.core.dialogs.send_records import SendRecords
from kbroker.core.dialogs.sequence_reach import MAX_SEQUENCE, needs_look_up, sequence_refusal
from kbroker.core.dialogs.statement_base import MESSAGE_AFTER_END, dead_letter_event, first_in
from kbroker.core.dialogs.validation import validate_body
from kbroker.core.records import Record
from kbroker.errors import CatalogError, ContractViolationError, MessageValidationError


class ReceiveStatements(SendRecords):
    """This side's endpoint after a RECEIVE, and the records of the messages it sets aside."""

    # --- RECEIVE --------------------------------------------------------------------------------

    def after_receive(self, msg: Message, ep: Endpoint | None) -> tuple[bool, Endpoint | None]:
        """This side's endpoint after receiving `msg`: (deliver it?, endpoint to stage). `ep` is
        this side's endpoint as found (None: it does not exist here)."""
        env = msg.extra["envelope"]
        created = None
        if ep is None:
            if env.to_side != "TARGET":
                return True, None  # the initiator's endpoint was cleaned up or never stored here
            # A dialog's first message creates the target endpoint, as in Service Broker; its
            # replies carry the key the initiator asked for (its related group, if any).
            # (No kb.reply_conversation_group_id: a dialog begun when the dialog id was the
            # initiator's default group, which every dialog since names in the header.)
            ep = created = new_target_endpoint(
                env.conversation_id,
                env.conversation_group_id,
                env.reply_group or env.conversation_id,
                env.to_service_name,
                env.from_service_name,
                env.service_contract_name,
                far_instance=env.reply_instance,
                lifetime=env.lifetime,
                far_broker=env.from_broker,
                session=env.session,
                priorities=(
                    self.endpoint_priority(env.service_contract_name, env.to_service_name, env.from_service_name),
                    self.endpoint_priority(env.service_contract_name, env.from_service_name, env.to_service_name),
                ),
            )
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

    def refused_record(
        self, msg: Message, ep: Endpoint | None = None, catalog: Catalog | None = None
    ) -> tuple[list[Record], str] | None:
        """(dead letter and its event, reason) for a received message this side must not deliver,
        or None. `ep`: this side's endpoint as found. SEND checks a message where it is sent, but
        a record written by another Kafka client with well-formed headers never passed SEND;
        Service Broker checks a message where it arrives, and so does this, as SEND would have:
        a sequence number its sender can have reached (sequence_reach.py), a body within the
        queue's max_message_bytes (the -9602 the dispatcher answers a routed one with), a type
        the catalog knows, that the contract lets the sending side send, and a body its
        validation accepts. The system types (EndDialog, Error, DialogTimer) are the broker's:
        only their number and size are checked. `catalog`: the one a RECEIVE found, used first
        (an object it does not know is looked up again)."""
        env = msg.extra["envelope"]
        kind = env.message_type_name
        sender = "INITIATOR" if env.to_side == "TARGET" else "TARGET"
        lookup = self._lookup if catalog is None else first_in(catalog, self._lookup)
        try:
            why = sequence_refusal(env.message_sequence_number, kind, kind in SYSTEM_TYPES, self._far_reach(env, ep))
            queue = lookup(lambda c: c.queue(msg.queue))
            if why is None and len(msg.body) > queue.max_message_bytes:
                why = too_large_reason(len(msg.body), queue.name, queue.max_message_bytes)
            if why is None and kind not in SYSTEM_TYPES:
                mt = lookup(lambda c: c.message_type(kind))
                if not lookup(lambda c: c.may_send(env.service_contract_name, kind, sender)):
                    raise ContractViolationError(kind, env.service_contract_name, sender)
                # As it was checked when it was queued: ALTER MESSAGE TYPE leaves queued messages be.
                validation, collection = mt.validation_at(msg.enqueued_time)
                then = (
                    mt
                    if collection == mt.schema_collection
                    else mt.model_copy(update={"schema_collection": collection})
                )
                validate_body(kind, validation, msg.body, lookup(lambda c: c.schema_collection_of(then)))
        except (CatalogError, ContractViolationError, MessageValidationError) as exc:
            why = str(exc)
        if why is None:
            return None
        reason = f"refused on arrival: {why}"
        return self._set_aside(msg, reason), reason

    def _far_reach(self, env: Envelope, ep: Endpoint | None) -> int | None:
        """sequence_reach.reach() of the side that sent `env`, looked up only when its number
        needs it and that side may be in this namespace."""
        seq = env.message_sequence_number
        if not needs_look_up(seq) or seq > MAX_SEQUENCE:
            return None
        if ep.remote if ep is not None else env.from_broker is not None:
            return None  # another namespace's side: its dispatcher saves its numbers in order
        return self._sender_reach(handle_for(env.conversation_id, other(env.to_side)), seq)

    def _set_aside(self, msg: Message, reason: str) -> list[Record]:
        """A received message's dead letter and the event that says so (G8)."""
        record = msg.extra["record"]
        return [
            dead_letter_record(self.namespace, record, reason),
            dead_letter_event(self.namespace, msg.queue, record, reason, self._clock()),
        ]

    def closed_records(self, msg: Message, ep: Endpoint | None) -> tuple[list[Record], str] | None:
        """A message of the peer's for an endpoint CLOSED here (both sides ended): never delivered,
        and not dropped in silence either: (its dead letter and event, the reason), else None. An
        endpoint ended here WITH CLEANUP discards its messages, as its user asked. The peer's
        EndDialog or Error, and kbroker's own timer messages, are only consumed (after_receive):
        they can cross an end legitimately.
        Nothing goes back to the peer: a CLOSED endpoint sends nothing."""
        env = msg.extra["envelope"]
        if ep is None or ep.state != CLOSED or ep.cleaned_up or env.message_type_name in SYSTEM_TYPES:
            return None
        reason = (
            f"{env.message_type_name!r} arrived for conversation {ep.conversation_handle}, which is "
            f"{ep.state_desc} on the {ep.side.lower()} side (sequence {env.message_sequence_number})"
        )
        return self._set_aside(msg, reason), reason

    def late_records(self, msg: Message, ep: Endpoint | None) -> tuple[list[Record], Endpoint, str] | None:
        """A message the peer sent after the peer's side had ended the dialog (its EndDialog or
        Error is already here: one of the peer's processes SENT from an endpoint another had
        ended). Never delivered: (its dead letter and an Error back to the peer's side, this
        side's endpoint after sending that Error, the reason), else None."""
        env = msg.extra["envelope"]
        if ep is None or ep.state not in (DISCONNECTED_INBOUND, ERROR) or env.message_type_name in SYSTEM_TYPES:
            return None
        reason = (
            f"{env.message_type_name!r} arrived after the {other(ep.side).lower()} side ended the "
            f"conversation (sequence {env.message_sequence_number})"
        )
        error, _ = self._record(ep, ERROR_TYPE, error_body(MESSAGE_AFTER_END, reason))
        return [*self._set_aside(msg, reason), error], ep.after_send(), reason

    @staticmethod
    def rekey_record(topic: str, msg: Message, group: str) -> Record:
        """The record that carries a moved conversation's message one hop along its group chain."""
        env = msg.extra["envelope"]
        origin = f"{msg.partition}:{msg.offset}"
        headers = rekeyed_headers(msg.extra["record"].headers() or [], group, env.hop + 1, origin)
        return (topic, group, msg.body, headers)
