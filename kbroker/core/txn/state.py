"""Where a kbroker transaction is (a Service Broker Transaction or a transport transaction), and
where it may go from there. Pure logic, no I/O.

A transaction is OPEN from its start until commit() or rollback() ends it, and then stays where
it ended: COMMITTED, ABORTED (its Kafka transaction did not commit), IN_DOUBT (whether it did
cannot be learnt) or ROLLED_BACK. Not Kafka's own transaction states, which its transaction log
records (core/txn/transaction_log.TxnState).

The values are what the transaction says of itself ("the transaction is already rolled back"),
and, a StrEnum, each member equals its text: `tx.state == "open"` holds as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from kbroker.errors import TransactionStateError


class TransactionState(StrEnum):
    """A kbroker transaction's state; TRANSITIONS says where each may go."""

    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    IN_DOUBT = "in doubt"
    ROLLED_BACK = "rolled back"

    def is_transition_valid(self, target: TransactionState) -> bool:
        """Whether a transaction in this state may move to `target`."""
        return target in TRANSITIONS[self]

    @property
    def terminal(self) -> bool:
        """Whether the transaction is over: no state follows this one."""
        return not TRANSITIONS[self]

    def to(self, target: TransactionState) -> TransactionState:
        """`target`, when this state may move to it; TransactionStateError (naming where the
        transaction already is) when it may not."""
        if not self.is_transition_valid(target):
            raise TransactionStateError(f"the transaction is already {self.value}")
        return target


_S = TransactionState

# Each state -> the states it may move to. Every end is for good.
TRANSITIONS: Mapping[TransactionState, frozenset[TransactionState]] = {
    _S.OPEN: frozenset({_S.COMMITTED, _S.ABORTED, _S.IN_DOUBT, _S.ROLLED_BACK}),
    _S.COMMITTED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.IN_DOUBT: frozenset(),
    _S.ROLLED_BACK: frozenset(),
}
