"""A dialog's beginning and ending as records: BEGIN DIALOG (and the conversation group it joins),
its LIFETIME timer, MOVE CONVERSATION, END CONVERSATION and BEGIN CONVERSATION TIMER."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import replace

import orjson

from kbroker.core.catalog.models import END_DIALOG, MAX_SERVICE_NAME
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dialogs import timers
from kbroker.core.dialogs.conversation_endpoint import (
    CLOSED,
    DISCONNECTED_INBOUND,
    DISCONNECTED_OUTBOUND,
    ERROR,
    MAX_LIFETIME,
    STARTED_OUTBOUND,
    Endpoint,
    chain_key,
    default_group,
    handle_for,
)
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE, Envelope, error_body
from kbroker.core.dialogs.groups import MOVE_MARKER, moved
from kbroker.core.dialogs.send_records import SendRecords
from kbroker.core.dialogs.statement_base import CURRENT_DATABASE, group_id
from kbroker.core.ids import new_id
from kbroker.core.records import Record
from kbroker.errors import ConversationClosedError, ConversationGroupError, InvalidArgumentError, UnknownContractError


class DialogStatements(SendRecords):
    """BEGIN DIALOG, MOVE CONVERSATION, END CONVERSATION and BEGIN CONVERSATION TIMER."""

    # --- BEGIN DIALOG and conversation groups -------------------------------------------------

    def new_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str = "DEFAULT",
        *,
        endpoint_of: Callable[[str], Endpoint],
        lifetime: int | None = None,
        related_conversation_group: str | None = None,
        related_conversation: str | None = None,
        encryption: bool = False,
        instance: str | None = None,
        broker_instance: str | None = None,
    ) -> Endpoint:
        """The initiator endpoint of a new dialog. RELATED_CONVERSATION (a handle, looked up with
        `endpoint_of`) or RELATED_CONVERSATION_GROUP (a GUID, new or existing) choose its group;
        `instance` sends the replies to that instance's secondary queue (which the caller makes
        sure exists). ENCRYPTION = ON holds a remote dialog's messages in the transmission topic until
        its dialog security is in place (a remote service binding for the target service); a
        binding secures the dialog whatever ENCRYPTION says (docs/security.md#dialog-security).

        TO SERVICE 'to_service', 'broker_instance': a service this namespace does not host, or
        one named with another namespace's broker instance, is remote: the dialog's messages go
        through the transmission topic and the routes decide where (see routing.md), as Service
        Broker's go to sys.transmission_queue. 'CURRENT DATABASE' (or this namespace) is local."""
        fs = self._lookup(lambda c: c.service(from_service))
        self._lookup(lambda c: c.contract(contract))
        if broker_instance is not None and (not isinstance(broker_instance, str) or not broker_instance):
            raise InvalidArgumentError("broker_instance must be a namespace name or 'CURRENT DATABASE'")
        local = broker_instance in (None, CURRENT_DATABASE, self.namespace)
        remote = not local or not self._lookup(lambda c: to_service in c.services)
        if not remote:
            if not self._lookup(lambda c: c.service_accepts(to_service, contract)):
                raise UnknownContractError(contract, to_service)
        elif not to_service or len(to_service) > MAX_SERVICE_NAME:
            raise InvalidArgumentError(f"a target service name is 1-{MAX_SERVICE_NAME} characters")
        if lifetime is not None and lifetime <= 0:
            raise InvalidArgumentError("lifetime must be a positive number of seconds")
        if related_conversation is not None and related_conversation_group is not None:
            raise InvalidArgumentError("give RELATED_CONVERSATION or RELATED_CONVERSATION_GROUP, not both")
        conversation_id = new_id()
        group = default_group(conversation_id, "INITIATOR")
        if related_conversation is not None:
            related = endpoint_of(str(related_conversation))
            group = related.conversation_group_id
            other_queue = self.queue_of(related.service_name)
            if other_queue != fs.queue:
                raise ConversationGroupError(group, fs.queue, other_queue)
        elif related_conversation_group is not None:
            group = group_id(related_conversation_group)
            self.check_group_queue(group, fs.queue)
        now = self._clock()
        # Rounded up to whole seconds (the topic's record keeps seconds): never shorter than asked.
        # Truncating `now` took up to a second off, and a 1 s lifetime could end before the first SEND.
        expires = None if lifetime is None else math.ceil(now + int(lifetime))  # None: never expires
        return Endpoint(
            handle_for(conversation_id, "INITIATOR"),
            conversation_id,
            "INITIATOR",
            group,
            default_group(conversation_id, "TARGET"),
            from_service,
            to_service,
            contract,
            STARTED_OUTBOUND,
            lifetime=expires,
            updated=now,
            instance=instance,
            remote=remote,
            far_broker=None if local else broker_instance,
            priority=self.endpoint_priority(contract, from_service, to_service),
            far_priority=5 if remote else self.endpoint_priority(contract, to_service, from_service),
            encryption=remote and bool(encryption),
        )

    def check_group_queue(self, group: str, queue: str, *, ignore: str | None = None) -> None:
        """Groups are local to a queue: refuse a group that only conversations of another queue
        use. (A dialog begun before each side had its own default group used the dialog id for
        both sides, so one id may be a group on two queues; it is then this queue's group too.)"""
        others = set()
        for ep in self._in_group(group):
            if ep.conversation_handle != ignore and ep.state != CLOSED:
                other_queue = self.queue_of(ep.service_name)
                if other_queue == queue:
                    return
                others.add(other_queue)
        if others:
            raise ConversationGroupError(group, queue, min(others))

    def lifetime_records(self, ep: Endpoint) -> list[Record]:
        """BEGIN DIALOG ... LIFETIME: the timer that delivers Error -8489 to both sides."""
        if ep.lifetime is None:
            return []
        # The far side of a remote dialog arms its own lifetime when the first message arrives
        # there (its dispatcher), so each namespace's timer service tells its own side.
        far_topic = None if ep.remote else self.queue_topic_of(ep.far_service_name, None)
        return [timers.lifetime_record(self.namespace, ep, self.own_topic(ep), far_topic)]

    def move_records(self, ep: Endpoint, group: str) -> tuple[Endpoint, list[Record]]:
        """MOVE CONVERSATION: this side's endpoint after the move, and the marker record that
        tells the old group's reader where the move happened (see groups.py)."""
        group = group_id(group)
        queue = self._lookup(lambda c: c.service(ep.service_name)).queue
        self.check_group_queue(group, queue, ignore=ep.conversation_handle)
        new, needs_marker = moved(ep, group)
        if not needs_marker:
            return new, []
        old = ep.conversation_group_id
        env = Envelope(
            message_id=new_id(),
            conversation_id=ep.conversation_id,
            conversation_group_id=old,
            message_sequence_number=SYSTEM_SEQUENCE,
            message_type_name=MOVE_MARKER,
            service_contract_name=ep.service_contract_name,
            from_service_name=ep.service_name,
            to_service_name=ep.service_name,
            to_side=ep.side,
            hop=len(ep.chain) - 1,
        )
        chain = orjson.dumps(list(new.chain))
        return new, [
            (self.own_topic(ep), old, chain, env.headers()),
            (self.endpoints_topic, chain_key(ep.conversation_handle), chain, None),
        ]

    # --- END CONVERSATION, BEGIN CONVERSATION TIMER ---------------------------------------------

    def end_records(
        self, ep: Endpoint, *, error: int | None, description: str | None, cleanup: bool
    ) -> tuple[list[Record], Endpoint | None]:
        """END CONVERSATION's records and the endpoint after it."""
        if cleanup:
            # WITH CLEANUP ends this side silently and removes its queued messages. Kafka cannot
            # delete single records, so the endpoint stays, CLOSED and marked cleaned up: a RECEIVE
            # discards its messages where Service Broker deletes them (a closed endpoint's others
            # are set aside, closed_records), and a late one can never create it again (removed,
            # the next message made a new target endpoint).
            return [], replace(ep, state=CLOSED, cleaned_up=True)
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        if error is not None and (not isinstance(error, int) or error <= 0):
            raise InvalidArgumentError("error code must be a positive integer (negative codes are Service Broker's)")
        if ep.state == STARTED_OUTBOUND:  # never sent anything: no peer endpoint to tell
            return [], replace(ep, state=CLOSED, cleaned_up=True)
        # After the peer ended (DI) or failed (ER), the EndDialog sent here is the acknowledgement
        # that moves the peer's DISCONNECTED_OUTBOUND endpoint to CLOSED; its app never sees it.
        peer_done = ep.state in (DISCONNECTED_INBOUND, ERROR)
        if peer_done and not ep.remote and not self._lookup(lambda c: ep.far_service_name in c.services):
            return [], replace(ep, state=CLOSED)  # its far service was dropped (DROP SERVICE): none to acknowledge
        body = error_body(error, description or "") if error is not None and not peer_done else b""
        rec, _ = self._record(ep, ERROR_TYPE if body else END_DIALOG, body)
        return [rec], ep.after_send().after_local_end()

    def timer_records(self, ep: Endpoint, timeout: float) -> tuple[list[Record], Endpoint]:
        """BEGIN CONVERSATION TIMER's records: the new arm, and the old one's tombstone (one timer
        per side; arming again replaces it)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_LIFETIME:
            raise InvalidArgumentError(f"timer timeout must be 0 < seconds <= {MAX_LIFETIME}, not {timeout!r}")
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        arm_id, due = uuid.uuid4().hex[:16], self._clock() + float(timeout)
        records = [r for r in [timers.disarm_record(self.namespace, ep)] if r is not None]
        records.append(timers.arm_record(self.namespace, ep, arm_id, due, self.own_topic(ep)))
        return records, replace(ep, dialog_timer=due, dialog_timer_id=arm_id)
