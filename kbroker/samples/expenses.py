"""The expenses sample's activation procedure: ExpenseQueue's activated reader approves claims.

Like a Service Broker activated stored procedure it RECEIVEs in a loop, each batch in its own
transaction, and returns when a RECEIVE waits `wait` seconds and finds nothing.
"""

from __future__ import annotations

from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG, ERROR

APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"


def process_claims(broker, queue: str, wait: float = 1.0) -> int:
    handled = 0
    while True:
        with broker.transaction() as tx:
            msgs = tx.receive(queue, top=10, wait=wait)
            if not msgs:
                return handled
            for m in msgs:
                if m.message_type_name in (END_DIALOG, ERROR):
                    tx.end_conversation(m.conversation_handle)
                elif m.message_type_name != DIALOG_TIMER:
                    tx.send(m.conversation_handle, APPROVAL, {"approved": True, "claim": m.message_id})
                handled += 1
