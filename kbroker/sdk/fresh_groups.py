"""The conversation groups BEGIN DIALOG made in this process outside a transaction: the first
transaction that locks one takes no hold on the holds topic (sdk/group_locks.py says why)."""

from __future__ import annotations

import threading
from collections import OrderedDict

FRESH_KEPT = 20_000  # groups remembered as fresh; an older one takes a hold like any other


class FreshGroups:
    """The groups BEGIN DIALOG made here outside a transaction, until a transaction first locks
    one (at most FRESH_KEPT, the oldest forgotten first)."""

    def __init__(self, kept: int = FRESH_KEPT):
        self._groups: OrderedDict[str, None] = OrderedDict()
        self._kept = kept
        self._mutex = threading.Lock()

    def add(self, group: str) -> None:
        """BEGIN DIALOG made `group` here, outside a transaction."""
        with self._mutex:
            self._groups[group] = None
            if len(self._groups) > self._kept:
                self._groups.popitem(last=False)

    def take(self, group: str) -> bool:
        """Whether `group` was fresh; it is not any more."""
        with self._mutex:
            return self._groups.pop(group, 0) is None
