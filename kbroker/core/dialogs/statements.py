"""Service Broker's statements as records: BEGIN DIALOG, SEND, END CONVERSATION, BEGIN
CONVERSATION TIMER, MOVE CONVERSATION and what a RECEIVE does to this side's endpoint.

Each builder validates its statement against the catalog and the endpoint, and returns the
records to produce and the endpoint after the statement, before any Kafka client sees them. The
SDK produces them at once (a statement outside a transaction) or holds them until commit (inside
one), so a statement validates the same way on both paths. Endpoint transitions themselves are
endpoint.py's.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import orjson

from kbroker.core import names
from kbroker.core.dialogs import timers
from kbroker.core.dialogs.arrival import too_large_reason
from kbroker.core.catalog.models import END_DIALOG, MAX_SERVICE_NAME, SYSTEM_TYPES, Catalog
from kbroker.core.topic_limits import MAX_QUEUE_MESSAGE_BYTES
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dead_letter import ConsumedRecord, dead_letter_record  # noqa: F401 - statements' dead letters
from kbroker.core.dialogs.conversation_endpoint import (
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
    default_group,
    handle_for,
    new_target_endpoint,
    other,
)
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE, Envelope, Message, error_body
from kbroker.core.dialogs.groups import MOVE_MARKER, moved, parse_group, rekeyed_headers
from kbroker.core.ids import new_id
from kbroker.core.records import Record
from kbroker.core.dialogs.send_lease import SendLease, lease_key
from kbroker.core.dialogs.sequence_reach import MAX_SEQUENCE, needs_look_up, sequence_refusal
from kbroker.core.dialogs.validation import to_bytes, validate_body
from kbroker.errors import (
    CatalogError,
    ContractViolationError,
    ConversationClosedError,
    ConversationGroupError,
    InvalidArgumentError,
    MessageTooLargeError,
    MessageValidationError,
    UnknownContractError,
)

# The Error code kbroker sends back for a message that arrived after its sender's side had ended
# the dialog (kbroker's own: negative like Service Broker's broker errors, outside their range).
MESSAGE_AFTER_END = -9601
CURRENT_DATABASE = "CURRENT DATABASE"  # BEGIN DIALOG ... TO SERVICE 's', 'CURRENT DATABASE'

T = TypeVar("T")

DEAD_LETTERED = "MESSAGE_DEAD_LETTERED"  # the event beside each dead letter a RECEIVE writes (G8)


def dead_letter_event(namespace: str, queue: str, record: ConsumedRecord, reason: str, now: float) -> Record:
    """The event that says a message of `queue` was dead-lettered on RECEIVE, and why, on the
    namespace's events topic (keyed by the queue, as its other events are): written in the
    transaction of the dead letter, so each such dead letter has exactly one."""
    event = {"event": DEAD_LETTERED, "queue": queue, "topic": record.topic(), "partition": record.partition(),
             "offset": record.offset(), "reason": reason, "time": int(now * 1000)}
    return (names.events_topic(namespace), queue, orjson.dumps(event), None)


class Lookup(Protocol):
    """A catalog look-up: calls `fn` with the catalog and, when it raises CatalogError, once more
    with a freshly read catalog before letting the error through."""

    def __call__(self, fn: Callable[[Catalog], T]) -> T: ...


def _first_in(catalog: Catalog, lookup: Lookup) -> Lookup:
    """A look-up in `catalog`, falling back to `lookup` for an object `catalog` does not know."""

    def first(fn: Callable[[Catalog], T]) -> T:
        try:
            return fn(catalog)
        except CatalogError:
            return lookup(fn)

    return first


def group_id(value: object) -> str:
    """A conversation group argument in its canonical form; InvalidArgumentError if no GUID."""
    try:
        return parse_group(value)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


class Statements:
    """Builds the records of the statements of one namespace.

    `lookup` reads the catalog (see Lookup); `in_group` gives the endpoints of one conversation
    group, for the rule that a group belongs to one queue; `clock` gives seconds since the epoch
    (lifetimes, timers, expiries); `sender_reach(handle, sequence)` gives sequence_reach.reach() of
    side `handle` as the endpoints topic says, read further when `sequence` is at or past what is
    known (None: no record of that side here)."""

    def __init__(self, namespace: str, lookup: Lookup, in_group: Callable[[str], Iterable[Endpoint]], *,
                 clock: Callable[[], float] = time.time,
                 sender_reach: Callable[[str, int], int | None] = lambda handle, sequence: None):
        self.namespace = namespace
        self._lookup = lookup
        self._in_group = in_group
        self._clock = clock
        self._sender_reach = sender_reach
        self.endpoints_topic = names.endpoints_topic(namespace)

    # --- BEGIN DIALOG and conversation groups -------------------------------------------------

    def new_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", *,
                   endpoint_of: Callable[[str], Endpoint], lifetime: int | None = None,
                   related_conversation_group: str | None = None, related_conversation: str | None = None,
                   encryption: bool = False, instance: str | None = None,
                   broker_instance: str | None = None) -> Endpoint:
        """The initiator endpoint of a new dialog. RELATED_CONVERSATION (a handle, looked up with
        `endpoint_of`) or RELATED_CONVERSATION_GROUP (a GUID, new or existing) choose its group;
        `instance` sends the replies to that instance's secondary queue (which the caller makes
        sure exists). ENCRYPTION is accepted and has no effect.

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
        return Endpoint(handle_for(conversation_id, "INITIATOR"), conversation_id, "INITIATOR", group,
                        default_group(conversation_id, "TARGET"), from_service, to_service, contract,
                        STARTED_OUTBOUND,
                        lifetime=expires, updated=now, instance=instance, remote=remote,
                        far_broker=None if local else broker_instance)

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
        env = Envelope(message_id=new_id(), conversation_id=ep.conversation_id,
                       conversation_group_id=old, message_sequence_number=SYSTEM_SEQUENCE,
                       message_type_name=MOVE_MARKER, service_contract_name=ep.service_contract_name,
                       from_service_name=ep.service_name, to_service_name=ep.service_name, to_side=ep.side,
                       hop=len(ep.chain) - 1)
        chain = orjson.dumps(list(new.chain))
        return new, [(self.own_topic(ep), old, chain, env.headers()),
                     (self.endpoints_topic, chain_key(ep.conversation_handle), chain, None)]

    # --- topics ---------------------------------------------------------------------------------

    def own_topic(self, ep: Endpoint) -> str:
        """The topic this side of a conversation receives from."""
        return self.queue_topic_of(ep.service_name, ep.instance)

    def queue_of(self, service: str) -> str:
        """The queue of `service`."""
        return self._lookup(lambda c: c.service(service)).queue

    def queue_topic_of(self, service: str, instance: str | None) -> str:
        """Where messages for `service` land: its queue, or that queue's secondary queue."""
        queue = self.queue_of(service)
        if instance is not None:
            return names.secondary_queue_topic(self.namespace, queue, instance)
        return names.queue_topic(self.namespace, queue)

    # --- SEND, END CONVERSATION, BEGIN CONVERSATION TIMER ---------------------------------------

    def message_record(self, ep: Endpoint, message_type: str, body: Any = None, *,
                       correlation_id: str | None = None, reply_to: str | None = None,
                       time_to_be_received: float | None = None, priority: int = 5) -> tuple[Record, str, Endpoint]:
        """Validate a SEND and build its record: (record, message id, endpoint after the send)."""
        data = to_bytes(body)
        if ep.state not in SENDABLE:
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        if ep.lifetime is not None and ep.lifetime < self._clock():
            raise ConversationClosedError(ep.conversation_handle, "lifetime expired")
        mt = self._lookup(lambda c: c.message_type(message_type))
        if message_type in SYSTEM_TYPES or not self._lookup(
                lambda c: c.may_send(ep.service_contract_name, message_type, ep.side)):
            raise ContractViolationError(message_type, ep.service_contract_name, ep.side)
        validate_body(message_type, mt.validation, data)
        if not 1 <= priority <= 10:
            raise InvalidArgumentError("priority must be 1-10")
        expires = None if time_to_be_received is None else int((self._clock() + time_to_be_received) * 1000)
        record, message_id = self._record(ep, message_type, data, correlation_id=correlation_id,
                                          reply_to=reply_to, expires=expires, priority=priority)
        return record, message_id, after_send(ep)

    def end_records(self, ep: Endpoint, *, error: int | None, description: str | None,
                    cleanup: bool) -> tuple[list[Record], Endpoint | None]:
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
            raise InvalidArgumentError(
                "error code must be a positive integer (negative codes are Service Broker's)")
        if ep.state == STARTED_OUTBOUND:  # never sent anything: no peer endpoint to tell
            return [], replace(ep, state=CLOSED, cleaned_up=True)
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
            raise InvalidArgumentError(f"timer timeout must be 0 < seconds <= {MAX_LIFETIME}, not {timeout!r}")
        if ep.state in (DISCONNECTED_OUTBOUND, CLOSED):
            raise ConversationClosedError(ep.conversation_handle, ep.state_desc)
        arm_id, due = uuid.uuid4().hex[:16], self._clock() + float(timeout)
        records = [r for r in [timers.disarm_record(self.namespace, ep)] if r is not None]
        records.append(timers.arm_record(self.namespace, ep, arm_id, due, self.own_topic(ep)))
        return records, replace(ep, dialog_timer=due, dialog_timer_id=arm_id)

    def lease_record(self, lease: SendLease) -> Record:
        """The endpoints-topic record of a side's conversation lease (send_lease.py)."""
        return (self.endpoints_topic, lease_key(lease.handle), lease.to_json(), None)

    def endpoint_record(self, handle: str, ep: Endpoint | None) -> Record:
        """The endpoints-topic record of `handle` (None: its tombstone)."""
        return (self.endpoints_topic, handle, None if ep is None else ep.to_json(), None)

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
            ep = created = new_target_endpoint(env.conversation_id, env.conversation_group_id,
                                               env.reply_group or env.conversation_id, env.to_service_name,
                                               env.from_service_name, env.service_contract_name,
                                               far_instance=env.reply_instance, lifetime=env.lifetime,
                                               far_broker=env.from_broker)
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

    def refused_record(self, msg: Message, ep: Endpoint | None = None,
                       catalog: Catalog | None = None) -> tuple[list[Record], str] | None:
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
        lookup = self._lookup if catalog is None else _first_in(catalog, self._lookup)
        try:
            why = sequence_refusal(env.message_sequence_number, kind, kind in SYSTEM_TYPES, self._far_reach(env, ep))
            queue = lookup(lambda c: c.queue(msg.queue))
            if why is None and len(msg.body) > queue.max_message_bytes:
                why = too_large_reason(len(msg.body), queue.name, queue.max_message_bytes)
            if why is None and kind not in SYSTEM_TYPES:
                mt = lookup(lambda c: c.message_type(kind))
                if not lookup(lambda c: c.may_send(env.service_contract_name, kind, sender)):
                    raise ContractViolationError(kind, env.service_contract_name, sender)
                validate_body(kind, mt.validation, msg.body)
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
        if (ep.remote if ep is not None else env.from_broker is not None):
            return None  # another namespace's side: its dispatcher saves its numbers in order
        return self._sender_reach(handle_for(env.conversation_id, other(env.to_side)), seq)

    def _set_aside(self, msg: Message, reason: str) -> list[Record]:
        """A received message's dead letter and the event that says so (G8)."""
        record = msg.extra["record"]
        return [dead_letter_record(self.namespace, record, reason),
                dead_letter_event(self.namespace, msg.queue, record, reason, self._clock())]

    def closed_records(self, msg: Message, ep: Endpoint | None) -> tuple[list[Record], str] | None:
        """A message of the peer's for an endpoint CLOSED here (both sides ended): never delivered,
        and not dropped in silence either: (its dead letter and event, the reason), else None. An
        endpoint ended here WITH CLEANUP discards its messages, as its user asked. The peer's EndDialog or Error, and kbroker's own timer
        messages, are only consumed (after_receive): they can cross an end legitimately.
        Nothing goes back to the peer: a CLOSED endpoint sends nothing."""
        env = msg.extra["envelope"]
        if ep is None or ep.state != CLOSED or ep.cleaned_up or env.message_type_name in SYSTEM_TYPES:
            return None
        reason = (f"{env.message_type_name!r} arrived for conversation {ep.conversation_handle}, which is "
                  f"{ep.state_desc} on the {ep.side.lower()} side (sequence {env.message_sequence_number})")
        return self._set_aside(msg, reason), reason

    def late_records(self, msg: Message, ep: Endpoint | None) -> tuple[list[Record], Endpoint, str] | None:
        """A message the peer sent after the peer's side had ended the dialog (its EndDialog or
        Error is already here: one of the peer's processes SENT from an endpoint another had
        ended). Never delivered: (its dead letter and an Error back to the peer's side, this
        side's endpoint after sending that Error, the reason), else None."""
        env = msg.extra["envelope"]
        if ep is None or ep.state not in (DISCONNECTED_INBOUND, ERROR) or env.message_type_name in SYSTEM_TYPES:
            return None
        reason = (f"{env.message_type_name!r} arrived after the {other(ep.side).lower()} side ended the "
                  f"conversation (sequence {env.message_sequence_number})")
        error, _ = self._record(ep, ERROR_TYPE, error_body(MESSAGE_AFTER_END, reason))
        return [*self._set_aside(msg, reason), error], ep.after_send(), reason

    @staticmethod
    def rekey_record(topic: str, msg: Message, group: str) -> Record:
        """The record that carries a moved conversation's message one hop along its group chain."""
        env = msg.extra["envelope"]
        origin = f"{msg.partition}:{msg.offset}"
        headers = rekeyed_headers(msg.extra["record"].headers() or [], group, env.hop + 1, origin)
        return (topic, group, msg.body, headers)

    # --- the message record ---------------------------------------------------------------------

    def _record(self, ep: Endpoint, message_type: str, data: bytes, *, correlation_id: str | None = None,
                reply_to: str | None = None, expires: int | None = None, priority: int = 5) -> tuple[Record, str]:
        """A message from this side to the far side's queue, keyed by the far side's group, with
        this side's next sequence number: (record, message id)."""
        if not ep.remote:
            far_service = self._lookup(lambda c: c.service(ep.far_service_name))
            far_queue = self._lookup(lambda c: c.queue(far_service.queue))
            if len(data) > far_queue.max_message_bytes:
                raise MessageTooLargeError(len(data), far_queue.max_message_bytes, far_queue.name)
        elif len(data) > MAX_QUEUE_MESSAGE_BYTES:  # the far queue's own limit is checked where it arrives
            raise MessageTooLargeError(len(data), MAX_QUEUE_MESSAGE_BYTES, "the transmission topic")
        reply_group = ep.chain[0]  # the key the far side's records must carry (see groups.py)
        env = Envelope(
            message_id=new_id(), conversation_id=ep.conversation_id,
            conversation_group_id=ep.far_conversation_group_id,
            message_sequence_number=ep.send_sequence, message_type_name=message_type,
            service_contract_name=ep.service_contract_name, from_service_name=ep.service_name,
            to_service_name=ep.far_service_name, to_side=other(ep.side),
            correlation_id=correlation_id, reply_to=reply_to, expires=expires, priority=priority,
            lifetime=ep.lifetime if ep.is_initiator else None,
            reply_group=None if reply_group == ep.conversation_id else reply_group,
            reply_instance=ep.instance,
            from_broker=self.namespace if ep.remote else None, to_broker=ep.far_broker)
        if ep.remote:  # one dialog side's messages keep their order in one partition
            return (names.transmission_topic(self.namespace), ep.conversation_handle, data,
                    env.headers()), env.message_id
        if ep.far_instance is not None:  # replies to an instance go to its secondary queue
            topic = names.secondary_queue_topic(self.namespace, far_queue.name, ep.far_instance)
        else:
            topic = names.queue_topic(self.namespace, far_queue.name)
        return (topic, env.conversation_group_id, data, env.headers()), env.message_id
