"""Several conversation groups in one transaction: RECEIVE repeated, each call locking the group it
took, one COMMIT for them all.

Service Broker's throughput advice is to batch: a reader that RECEIVEs one group per transaction
pays a COMMIT per group, and with one message in flight per dialog a group holds one message. In
kbroker a COMMIT is a Kafka transaction (about 5 ms here), so a reader that takes N groups in
one pays that once for N.

    with broker.transaction() as tx:
        for batch in tx.receive_groups("ExpenseQueue", groups=50, wait=5):
            for msg in batch:
                tx.send(msg.conversation_handle, reply_type, body)
"""

from __future__ import annotations

import time
from typing import Protocol

from kbroker.core.dialogs.envelope import Message
from kbroker.errors import InvalidArgumentError


class Receives(Protocol):
    """What a batch needs of a transaction (sdk/transaction.py's, which imports this module)."""

    def receive(self, queue: str, top: int | None = None, wait: float | None = 0.0) -> list[Message]:
        """RECEIVE: one group's messages, locked until the transaction ends."""
        ...

    def receive_ready(self, queue: str, top: int | None, wait: float) -> list[Message]:
        """A further RECEIVE: what the process holds now or within `wait` (Transaction's)."""
        ...


def check(groups: object, within: object) -> None:
    """The arguments' checks, shared by the threaded and asyncio forms.

    Raises
    ------
    InvalidArgumentError
        groups is not a whole number of at least 1, or within is negative.
    """
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise InvalidArgumentError(f"groups must be a whole number of at least 1, not {groups!r}")
    if isinstance(within, bool) or not isinstance(within, (int, float)) or within < 0:
        raise InvalidArgumentError(f"within must be a number of seconds of at least 0, not {within!r}")


def add(batches: dict[str, list[Message]], msgs: list[Message]) -> None:
    """Append one RECEIVE's messages to their group's batch: a later RECEIVE may give more of a
    group this transaction already holds (the receiver prefers its own groups on a tie)."""
    if msgs:
        batches.setdefault(msgs[0].conversation_group_id, []).extend(msgs)


def receive_groups(
    tx: Receives, queue: str, groups: int, top: int | None, wait: float | None, within: float
) -> list[list[Message]]:
    """Transaction.receive_groups: up to `groups` groups' messages, one list per group, in the
    order they were taken; empty when no group was ready within `wait`.

    Parameters
    ----------
    groups
        How many groups at most (at least 1).
    top
        RECEIVE's TOP for each group (None: the whole group).
    wait
        How long the first RECEIVE waits for a group (None: without time-out).
    within
        How long, after the first group, the others may take to arrive (0: those ready now).
    """
    check(groups, within)
    batches: dict[str, list[Message]] = {}
    add(batches, tx.receive(queue, top, wait))
    return more(tx, queue, batches, groups, top, within)


def more(
    tx: Receives, queue: str, batches: dict[str, list[Message]], groups: int, top: int | None, within: float
) -> list[list[Message]]:
    """After the first RECEIVE (its messages in `batches`): the other groups, RECEIVE by RECEIVE,
    until `groups` are held or none came within `within` s; the batches as receive_groups gives them."""
    if not batches:
        return []
    deadline = time.monotonic() + within
    while len(batches) < groups:
        held = len(batches)
        add(batches, tx.receive_ready(queue, top, max(deadline - time.monotonic(), 0.0)))
        if len(batches) == held and time.monotonic() >= deadline:
            break  # nothing new within the window (or only more of a group already held)
    return list(batches.values())
