"""CREATE BROKER PRIORITY and the HONOR_BROKER_PRIORITY database option as catalog objects, and
the rule that gives a conversation endpoint its priority.

An endpoint's priority is fixed when the endpoint is created (BEGIN DIALOG for the initiator,
the dialog's first message for the target) from the priority whose contract, local service and
remote service best match it; later changes to the priorities apply to new endpoints only. The
precedence is Service Broker's: a named contract beats ANY, then a named local service, then a
named remote service. No match: 5."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from kbroker.core.catalog.values import MAX_SERVICE_NAME, OnOff, StrictModel

ANY = "ANY"
DEFAULT_PRIORITY = 5


class BrokerPriority(StrictModel):
    """One conversation priority: `priority` (1-10) for the endpoints whose contract, local
    service and remote service it names (ANY matches every one)."""

    name: str = Field(min_length=1, max_length=128)
    contract: str = Field(default=ANY, min_length=1, max_length=256)
    local_service: str = Field(default=ANY, min_length=1, max_length=MAX_SERVICE_NAME)
    remote_service: str = Field(default=ANY, min_length=1, max_length=MAX_SERVICE_NAME)
    priority: int = Field(default=DEFAULT_PRIORITY, ge=1, le=10)


class DatabaseOption(StrictModel):
    """ALTER DATABASE ... SET <option>: the one option kbroker keeps in its catalog."""

    name: Literal["honor_broker_priority"]
    value: OnOff = "OFF"


def _rank(p: BrokerPriority, contract: str, local: str, remote: str) -> int | None:
    """How specific `p` is for this endpoint (higher wins), or None when it does not match."""
    rank = 0
    for weight, criterion, value in (
        (4, p.contract, contract),
        (2, p.local_service, local),
        (1, p.remote_service, remote),
    ):
        if criterion == value:
            rank += weight
        elif criterion != ANY:
            return None
    return rank


def conversation_priority(priorities: Iterable[BrokerPriority], contract: str, local: str, remote: str) -> int | None:
    """The priority of an endpoint of `contract` between its `local` and `remote` services, or
    None when no priority matches (the endpoint then has the default, 5). Two priorities with the
    same criteria cannot exist in Service Broker; here the one first by name wins, so the answer
    never depends on the order the catalog was read in."""
    best: tuple[int, str] | None = None
    level = None
    for p in priorities:
        rank = _rank(p, contract, local, remote)
        if rank is not None and (best is None or (-rank, p.name) < best):
            best, level = (-rank, p.name), p.priority
    return level


def honors_priority(options: dict[str, DatabaseOption]) -> bool:
    """HONOR_BROKER_PRIORITY: the transmitters send higher-priority dialogs first. Off by default,
    as in Service Broker; RECEIVE always honours priorities."""
    option = options.get("honor_broker_priority")
    return option is not None and option.value == "ON"
