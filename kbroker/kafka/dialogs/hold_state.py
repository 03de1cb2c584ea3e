"""What the group holds keep (kafka/dialogs/group_holds.py): per hold this process has, per
receiver it owns partitions for, and per other process's hold a receiver here keeps locked."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from kbroker.core.dialogs.group_hold import GroupKey


class GroupReader(Protocol):
    """What a queue receiver offers the holds: the group lock RECEIVE takes, without waiting."""

    def reserve_group(self, owner: Any, group: str) -> tuple[Any, bool]: ...

    def holds(self, lease: Any) -> bool: ...

    def unreserve(self, lease: Any) -> None: ...

    def release(self, lease: Any, committed: bool) -> None: ...

    def has_buffered(self, group: str) -> bool: ...


@dataclass(eq=False)
class RemoteHolder:
    """The owner of the receiver lease that keeps a group for another process's hold. A
    transaction here that waits for the group calls contended(): the follower then asks for it."""

    process: str
    epoch: int
    partition: int
    lease: Any = None
    locked: bool = False  # the lease locks the group (else it is reserved)
    granted: bool = False  # this process wrote the grant
    wanted: bool = False
    asked: bool = False

    def contended(self) -> None:
        self.wanted = True  # no lock: called under the receiver's, read by the follower


@dataclass
class Mine:
    """A hold this process has: `in_use` transactions hold it now."""

    key: GroupKey
    partition: int
    epoch: int
    until: float
    in_use: int = 0
    used: float = field(default_factory=time.monotonic)
    wanted: bool = False


@dataclass
class Owned:
    reader: GroupReader
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> its owner record's epoch
    renewed: float = 0.0
    holders: dict[str, RemoteHolder] = field(default_factory=dict)  # group -> its remote holder
    pending: bool = False  # a holder's lease waits for a transaction here to end
    lock: threading.RLock = field(default_factory=threading.RLock)  # holders: follower and poll threads
