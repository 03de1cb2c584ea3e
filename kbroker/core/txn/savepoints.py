"""SAVE TRANSACTION name and ROLLBACK TRANSACTION name: a transaction's savepoints (pure).

A kbroker transaction writes nothing before it commits (its SENDs, endpoint changes, timers and
leases are held), so a savepoint is a mark in that pending state: the transaction says what the
mark is (`Savepoints` keeps it, whatever its type) and restores it on a rollback to it. The rules
here are T-SQL's (docs/sources.md, item 160):

- a name is 1 to 32 characters, compared exactly;
- a name may be saved again: a rollback goes to the latest savepoint of that name;
- rolling back to a savepoint drops every savepoint set after it and keeps it, so the transaction
  may roll back to it again;
- a name no savepoint has is error 6401 (SavepointNotFoundError), and nothing changes.

What a rollback to a savepoint keeps (every lock the transaction holds) and gives back is the
transaction's: sdk/transaction.py.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from kbroker.errors import InvalidArgumentError, SavepointNotFoundError

M = TypeVar("M")

MAX_NAME = 32  # savepoint names are identifiers limited to 32 characters (item 160)


def check_name(name: object) -> str:
    """`name` as a savepoint name; InvalidArgumentError unless a string of 1-32 characters."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        raise InvalidArgumentError(f"a savepoint name is a string of 1 to {MAX_NAME} characters, not {name!r}")
    return name


class Savepoints(Generic[M]):
    """One transaction's savepoints, oldest first, each a name and the mark saved under it."""

    def __init__(self) -> None:
        self._stack: list[tuple[str, M]] = []

    def save(self, name: str, mark: M) -> None:
        """SAVE TRANSACTION name: `mark` under `name` (a repeated name is a new, later savepoint)."""
        self._stack.append((check_name(name), mark))

    def rollback_to(self, name: str) -> M:
        """ROLLBACK TRANSACTION name: the mark of the latest savepoint called `name`; the savepoints
        after it are gone, it stays. SavepointNotFoundError (6401) if there is none, and then
        nothing changes."""
        check_name(name)
        for i in range(len(self._stack) - 1, -1, -1):
            saved, mark = self._stack[i]
            if saved == name:
                del self._stack[i + 1 :]
                return mark
        raise SavepointNotFoundError(name)

    def discard_all(self) -> None:
        """The transaction ended: no savepoint outlives it."""
        self._stack.clear()

    @property
    def names(self) -> tuple[str, ...]:
        """The savepoints' names, oldest first."""
        return tuple(name for name, _ in self._stack)

    def __len__(self) -> int:
        return len(self._stack)
