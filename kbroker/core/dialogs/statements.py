"""Service Broker's statements as records: BEGIN DIALOG, SEND, END CONVERSATION, BEGIN
CONVERSATION TIMER, MOVE CONVERSATION and what a RECEIVE does to this side's endpoint.

Each builder validates its statement against the catalog and the endpoint, and returns the
records to produce and the endpoint after the statement, before any Kafka client sees them. The
SDK produces them at once (a statement outside a transaction) or holds them until commit (inside
one), so a statement validates the same way on both paths. Endpoint transitions themselves are
endpoint.py's.
"""

from __future__ import annotations

from kbroker.core.dead_letter import ConsumedRecord, dead_letter_record
from kbroker.core.dialogs.dialog_statements import DialogStatements
from kbroker.core.dialogs.receive_statements import ReceiveStatements
from kbroker.core.dialogs.statement_base import (
    CURRENT_DATABASE,
    DEAD_LETTERED,
    MESSAGE_AFTER_END,
    Lookup,
    dead_letter_event,
    group_id,
)

# The builders live by job, and Statements gathers them (its module-level names stay importable here):
#   statement_base.py      what they share: Lookup, the topics of a side, lease_record, endpoint_record
#   send_records.py        SEND (message_record), and the message record of every statement that sends
#   dialog_statements.py   new_dialog, check_group_queue, lifetime_records, move_records, end_records,
#                          timer_records
#   receive_statements.py  after_receive, refused_record, closed_records, late_records, rekey_record
__all__ = [
    "CURRENT_DATABASE",
    "DEAD_LETTERED",
    "MESSAGE_AFTER_END",
    "ConsumedRecord",
    "Lookup",
    "Statements",
    "dead_letter_event",
    "dead_letter_record",
    "group_id",
]


class Statements(DialogStatements, ReceiveStatements):
    """Builds the records of the statements of one namespace.

    `lookup` reads the catalog (see Lookup); `in_group` gives the endpoints of one conversation
    group, for the rule that a group belongs to one queue; `clock` gives seconds since the epoch
    (lifetimes, timers, expiries); `sender_reach(handle, sequence)` gives sequence_reach.reach() of
    side `handle` as the endpoints topic says, read further when `sequence` is at or past what is
    known (None: no record of that side here)."""
