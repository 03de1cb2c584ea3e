"""Conversation endpoints (sys.conversation_endpoints), one per side of a dialog.

Handles are derived from (conversation id, side), so a receiver knows its own handle from a
message's headers without a lookup. Endpoint state lives in a compacted topic keyed by handle;
every process keeps the entries it has read or written in memory and reads the topic forward
only when it meets a handle it does not know.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, replace

import orjson

from kbroker.core import ids
from kbroker.core.frozen import built

# Service Broker's endpoint states.
STARTED_OUTBOUND, CONVERSING, DISCONNECTED_INBOUND = "SO", "CO", "DI"
DISCONNECTED_OUTBOUND, ERROR, CLOSED = "DO", "ER", "CD"
STATE_DESC = {
    "SO": "STARTED_OUTBOUND",
    "SI": "STARTED_INBOUND",
    "CO": "CONVERSING",
    "DI": "DISCONNECTED_INBOUND",
    "DO": "DISCONNECTED_OUTBOUND",
    "ER": "ERROR",
    "CD": "CLOSED",
}
SENDABLE = {STARTED_OUTBOUND, CONVERSING}
MAX_LIFETIME = 2**31 - 1  # seconds: the longest LIFETIME or timer timeout Service Broker takes

_HANDLE_NS = uuid.UUID("6f1d6a52-3c51-4c1b-9a55-6b62726f6b65")


@functools.lru_cache(maxsize=16384)
def handle_for(conversation_id: str, side: str) -> str:
    """The endpoint handle of one side: stable, so both processes and restarts agree on it.
    Remembered: RECEIVE asks for it once per message, and a conversation's messages come in runs."""
    return ids.name_id(_HANDLE_NS, f"{conversation_id}/{side}")


_GROUP_NS = uuid.UUID("0b5e6c1e-7a43-4f59-8d0e-6b726f757073")


def default_group(conversation_id: str, side: str) -> str:
    """A side's conversation group when BEGIN DIALOG names no related one: its own, as in
    Service Broker (a dialog whose two services share a queue must not lock itself), and derived
    from the dialog id and the side, so the initiator keys its first SEND to the target's group
    without asking anyone. (Dialogs begun before this used the dialog id for both sides; their
    endpoints keep it.)"""
    return ids.name_id(_GROUP_NS, f"{conversation_id}/{side}")


def other(side: str) -> str:
    return "TARGET" if side == "INITIATOR" else "INITIATOR"


@dataclass(frozen=True)
class Endpoint:
    conversation_handle: str
    conversation_id: str
    side: str  # INITIATOR or TARGET
    conversation_group_id: str  # this side's group: the key of records this side receives
    far_conversation_group_id: str  # the key this side's sends carry
    service_name: str
    far_service_name: str
    service_contract_name: str
    state: str
    send_sequence: int = 0  # next sequence number to send
    lifetime: int | None = None  # epoch seconds after which the dialog has expired; None: never
    # Sequence numbers below this may have been used without a newer record of this endpoint:
    # SENDs persist the endpoint once per block of sequence numbers, not once per message.
    sequence_reserved: int = 0
    dialog_timer: float = 0.0  # epoch seconds the armed DialogTimer fires at; 0 = none
    dialog_timer_id: str | None = None  # the armed timer's key suffix in the timers topic
    updated: float = 0.0
    # After MOVE CONVERSATION: the groups this side's records pass through, starting with the key
    # the far side sends with (see groups.py). Empty: never moved, the key is conversation_group_id.
    group_chain: tuple[str, ...] = ()
    instance: str | None = None  # this side's secondary queue: replies come back to it
    far_instance: str | None = None  # the far side's secondary queue: this side's sends go to it
    # A dialog with a service of another namespace (another broker): its sends go through the
    # transmission topic, and `far_broker` is the far side's broker instance (its namespace) once
    # known (named by BEGIN DIALOG, or learnt from the far side's first message); None: the route
    # decides. Fixed when the dialog begins, so one dialog's messages never take two paths.
    remote: bool = False
    far_broker: str | None = None
    # Ended here WITH CLEANUP: the messages still queued for it are discarded on RECEIVE, as
    # Service Broker deletes them, instead of set aside as messages for a closed dialog are.
    cleaned_up: bool = False
    # sys.conversation_endpoints.priority: this side's, from the broker priorities when it was
    # created, kept to the end (core/catalog/priorities.py). `far_priority`: the far side's, which
    # this side's records carry within one namespace, so RECEIVE there orders them by it.
    priority: int = 5
    far_priority: int = 5
    # Dialog security of a remote dialog: BEGIN DIALOG's ENCRYPTION (the initiator's), and on the
    # target the session key the dialog's first message brought, sealed for this service's
    # certificate, which its replies are sealed with (core/security/dialog_security.py).
    encryption: bool = False
    session: str | None = None

    @property
    def send_priority(self) -> int:
        """The priority this side's records carry: the receiving side's within one namespace; a
        remote dialog's its own, for its transmitter (the far dispatcher puts the far side's)."""
        return self.priority if self.remote else self.far_priority

    @property
    def is_initiator(self) -> bool:
        return self.side == "INITIATOR"

    @property
    def chain(self) -> tuple[str, ...]:
        return tuple(self.group_chain) or (self.conversation_group_id,)

    def with_chain(self, chain: tuple[str, ...]) -> "Endpoint":
        """This endpoint with a longer group chain learned elsewhere (a MOVE). Chains only grow,
        so the longer one is the newer: a stale write elsewhere never undoes a move."""
        if len(chain) <= len(self.chain):
            return self
        return replace(self, conversation_group_id=chain[-1], group_chain=tuple(chain))

    @property
    def state_desc(self) -> str:
        return STATE_DESC[self.state]

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # orjson writes dataclasses natively, without asdict's copy

    @classmethod
    def from_json(cls, raw: bytes) -> "Endpoint":
        d = orjson.loads(raw)
        d["group_chain"] = tuple(d.get("group_chain") or ())
        if (d.get("lifetime") or 0) >= MAX_LIFETIME:
            d["lifetime"] = None  # written before "never" was None: Service Broker's 2038 default
        return cls(**d)

    # --- pure transitions ---------------------------------------------------------------

    def after_send(self) -> "Endpoint":
        return _changed(
            self,
            send_sequence=self.send_sequence + 1,
            state=CONVERSING if self.state == STARTED_OUTBOUND else self.state,
        )

    def after_local_end(self) -> "Endpoint":
        # Ending after the peer did completes the dialog; otherwise wait for the peer.
        return replace(self, state=CLOSED if self.state in (DISCONNECTED_INBOUND, ERROR) else DISCONNECTED_OUTBOUND)

    def after_peer_end(self) -> "Endpoint":
        return replace(self, state=CLOSED if self.state == DISCONNECTED_OUTBOUND else DISCONNECTED_INBOUND)

    def after_peer_error(self) -> "Endpoint":
        return replace(self, state=CLOSED if self.state == DISCONNECTED_OUTBOUND else ERROR)


# An endpoint's state only moves forward: SO, then CO, then one of DI / DO / ER, then CD.
_STAGE = {STARTED_OUTBOUND: 0, CONVERSING: 1, DISCONNECTED_INBOUND: 2, DISCONNECTED_OUTBOUND: 2, ERROR: 2, CLOSED: 3}


def merged_state(current: Endpoint | None, new: Endpoint) -> Endpoint | None:
    """The endpoint after record `new`, given what is known (`current`), or None when `new` is
    refused. Several processes write one endpoint, each from its own copy: a record that would
    move the state back (CO after DI, anything after CD) was written from a stale copy and is
    refused, so a stale writer never silently wins. Two ends written from one copy (DO by a
    process that ended, DI or ER by one that received the peer's end or error) are both true:
    the endpoint is CLOSED. Every reader applies this to the same records in the same order,
    so all agree."""
    if current is None or new.state == current.state:
        return new
    now, then = _STAGE[new.state], _STAGE[current.state]
    if now < then:
        return None
    if now == then == 2 and DISCONNECTED_OUTBOUND in (new.state, current.state):
        return replace(new, state=CLOSED)
    return new


# How long a CLOSED endpoint is kept before it is reclaimed (its tombstone written): as long as
# Service Broker keeps a target's closed endpoint, so a late duplicate of the dialog's messages
# finds it closed rather than beginning the dialog again.
CLOSED_GRACE_SECONDS = 30 * 60.0

SEQUENCE_BLOCK = 64  # sequence numbers one endpoint record reserves for SENDs that follow


def after_send(ep: Endpoint) -> Endpoint:
    """The endpoint after a SEND, reserving the next block of sequence numbers when the one just
    used was the last reserved (or the state changes): only then must the endpoint be written."""
    after = ep.after_send()
    if after.state != ep.state or ep.send_sequence >= ep.sequence_reserved:
        after = _changed(after, sequence_reserved=after.send_sequence + SEQUENCE_BLOCK)
    return after


def _changed(ep: Endpoint, **changes: object) -> Endpoint:
    """dataclasses.replace(ep, **changes) for the transitions every SEND makes. replace() runs
    __init__ over all 23 fields, a frozen object.__setattr__ each: a quarter of a SEND's own
    Python. Endpoint has no __post_init__, no slots and nothing cached in its __dict__, so the
    copy of its fields with `changes` is the object replace() builds (tests/unit/
    test_sequence_blocks.py compares the two)."""
    return built(Endpoint, ep.__dict__, **changes)


def must_persist(before: Endpoint, after: Endpoint) -> bool:
    """False for a SEND within the reserved block: the endpoint record need not be written."""
    return after.state != before.state or after.sequence_reserved != before.sequence_reserved


def new_target_endpoint(
    conversation_id: str,
    group_id: str,
    far_group_id: str,
    service: str,
    far_service: str,
    contract: str,
    far_instance: str | None = None,
    lifetime: int | None = None,
    far_broker: str | None = None,
    priorities: tuple[int, int] = (5, 5),
    session: str | None = None,
) -> Endpoint:
    """The target endpoint, created when the dialog's first message arrives (as SSB does).
    `far_broker`: the initiator's namespace when the message came from another one; `priorities`:
    (its priority, the initiator's)."""
    return Endpoint(
        handle_for(conversation_id, "TARGET"),
        conversation_id,
        "TARGET",
        group_id,
        far_group_id,
        service,
        far_service,
        contract,
        CONVERSING,
        updated=time.time(),
        far_instance=far_instance,
        lifetime=lifetime,
        remote=far_broker is not None,
        far_broker=far_broker,
        priority=priorities[0],
        far_priority=priorities[1],
        session=session if far_broker is not None else None,
    )


CHAIN_SUFFIX = "/groups"  # key of a moved endpoint's group chain, beside the endpoint's own key


def chain_key(handle: str) -> str:
    return handle + CHAIN_SUFFIX
