"""Undoing part of a Service Broker transaction: what a savepoint marks (SAVE TRANSACTION name,
whose names core/txn/savepoints.py keeps), what a rollback to it gives back (ROLLBACK
TRANSACTION name), and SEND ON CONVERSATION (h1, h2, ...), which is all or nothing.

A transaction writes nothing before it commits, so its pending state is all there is to undo:
the records and endpoint changes it holds (sdk/held.py), the messages each of its RECEIVE leases
took, and the per-queue counts its commit reports. What it never gives back before it ends are
its locks, as SQL Server keeps every lock on a partial rollback (docs/sources.md, item 160): the
conversation locks and leases SEND took, and every conversation group it locked, with or without
messages left in it. The messages RECEIVEd after the savepoint go back to the head of their group,
in order, for the next RECEIVE of it (this transaction's, until it ends); a partial rollback is
no rollback of the transaction, so it counts towards no poison verdict (G4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kbroker.errors import InvalidArgumentError, KBrokerError
from kbroker.kafka.receive.receiver import Lease
from kbroker.sdk.held import Held, HeldMark

Handles = list[str] | tuple[str, ...]  # SEND ON CONVERSATION (h1, h2, ...)


@dataclass(frozen=True, eq=False)
class Mark:
    """A transaction's pending state at a savepoint."""

    held: HeldMark
    taken: dict[Lease, int]  # each lease the transaction had, and how many records it had taken
    queues: frozenset[str]  # the queues it had delivered messages from
    sent: dict[str, int]
    received: dict[str, int]


def mark(held: Held, leases: Iterable[Lease], queues: set[str], sent: dict[str, int], received: dict[str, int]) -> Mark:
    """The mark of a savepoint taken now."""
    return Mark(
        held.mark(), {lease: len(lease.taken) for lease in leases}, frozenset(queues), dict(sent), dict(received)
    )


def give_back(leases: Iterable[Lease], saved: Mark) -> None:
    """The records each lease took after `saved` back at the head of their group, the group still
    locked by the lease; a lease first taken after it keeps its lock and gives back everything."""
    for lease in leases:
        keep = saved.taken.get(lease, 0)
        if len(lease.taken) > keep:
            lease.receiver.give_back(lease, keep)


def taken(leases: Iterable[Lease]) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """queue -> topic -> (partition, offset) of each message the leases' transaction received."""
    out: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for lease in leases:
        r = lease.receiver
        out.setdefault(r.queue, {}).setdefault(r.topic, []).extend((b.partition, b.offset) for b in lease.taken)
    return out


def conversations(handles: Handles) -> list[str]:
    """SEND ON CONVERSATION (h1, h2, ...)'s handles as text: InvalidArgumentError for none, or
    for one named twice (a second message on it is a second SEND)."""
    out = [str(h) for h in handles]
    if not out:
        raise InvalidArgumentError("SEND ON CONVERSATION needs at least one conversation handle")
    seen: set[str] = set()
    for h in out:
        if h in seen:
            raise InvalidArgumentError(f"conversation handle {h} is named twice in one SEND")
        seen.add(h)
    return out


def all_or_none(handles: list[str], send: Callable[[str], str], undo: Callable[[], None]) -> list[str]:
    """SEND on each of `handles` in turn (`send` returns the message id); the first refused undoes
    them all (`undo`: back to the mark taken before the first) and raises its error, naming the
    handle. The locks taken stay, as a failed statement's do."""
    ids = []
    for h in handles:
        try:
            ids.append(send(h))
        except KBrokerError as exc:
            undo()
            raise naming(exc, h)  # noqa: B904 - the same error, its message naming the handle
    return ids


def naming(exc: KBrokerError, handle: str) -> KBrokerError:
    """`exc`, the error a SEND on several conversations met on `handle`, saying so: its type
    unchanged (a caller catching ContractViolationError still does), its `conversation_handle`
    set, and its message naming the handle unless it did already."""
    setattr(exc, "conversation_handle", handle)  # noqa: B010 - an attribute of any KBrokerError
    text = str(exc)
    if handle not in text:
        exc.args = (f"SEND ON CONVERSATION {handle}: {text}", *exc.args[1:])
    return exc
