"""Which sequence number a received message may carry: one its sender can have reached.

SEND numbers one side's messages 0, 1, 2, ... under that side's lease (send_lease.py): a claim
or renewal lets its holder use numbers below a ceiling 1,024 past where it started, the next
claim starts at or past that ceiling, and a release writes the exact next number. So a side's
numbers rise, with gaps (up to 1,024 per claim after a crash: never refused here), but never
reach its latest lease's ceiling. A transaction may send more than a lease's span under one
claim; the endpoint record it commits with reserves past its last number (endpoint.after_send),
so that record bounds those. Both records are on the endpoints topic before, or with, the
message itself, so a reader that reads that topic forward finds them.

A record another Kafka client wrote may carry any number. One past its sender's reach would be
delivered, and, since one RECEIVE returns a conversation's messages in sequence order, sorted
after the dialog's later messages, even after its EndDialog. The rule:

- -1 (SYSTEM_SEQUENCE) only on kbroker's own messages (a DialogTimer, a lifetime's Error);
- otherwise an int in [0, reach), where reach is the sending side's reach() as this namespace's
  endpoints topic says. Every side's first lease covers 0-1,023, so a number below that needs
  no look-up. A side this namespace keeps no record of (the far side of a dialog with another
  namespace, whose dispatcher saves its numbers only in order; a client that keeps no
  endpoints) is held to the 63-bit range of Service Broker's bigint only.
"""

from __future__ import annotations

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE
from kbroker.core.dialogs.send_lease import SEQUENCE_SPAN, SendLease

MAX_SEQUENCE = 2**63 - 1  # Service Broker's message_sequence_number is a bigint
ANY_SIDE_REACH = SEQUENCE_SPAN  # a side's first lease lets it use 0 .. SEQUENCE_SPAN - 1


def reach(lease: SendLease | None, ep: Endpoint | None) -> int | None:
    """The first sequence number the side of `lease` and `ep` (its records on the endpoints
    topic) cannot have sent yet, or None when there is neither record."""
    if lease is None and ep is None:
        return None
    return max(
        ANY_SIDE_REACH,
        lease.ceiling if lease is not None else 0,
        ep.sequence_reserved if ep is not None else 0,
        ep.send_sequence if ep is not None else 0,
    )


def needs_look_up(sequence: int) -> bool:
    """Whether checking `sequence` needs the sender's records (below ANY_SIDE_REACH it does not)."""
    return sequence >= ANY_SIDE_REACH


def sequence_refusal(sequence: int, message_type: str, system: bool, sender_reach: int | None) -> str | None:
    """Why a received message's sequence number is refused, or None. `system`: the message type
    is one of kbroker's own (EndDialog, Error, DialogTimer); `sender_reach`: reach() of its
    sending side, None when unknown here."""
    if sequence == SYSTEM_SEQUENCE:
        return (
            None if system else f"sequence number {SYSTEM_SEQUENCE} is for kbroker's own messages, not {message_type!r}"
        )
    if not 0 <= sequence <= MAX_SEQUENCE:
        return f"sequence number {sequence} is outside 0-{MAX_SEQUENCE}"
    if sender_reach is not None and sequence >= sender_reach:
        return (
            f"sequence number {sequence} is past any its sender can have sent (below {sender_reach}, "
            f"its lease's ceiling)"
        )
    return None
