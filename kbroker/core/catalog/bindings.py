"""CREATE REMOTE SERVICE BINDING as a catalog object, and the rule that a far service has at most
one binding.

A binding is how the sending side secures a dialog to a service of another namespace: for the
far service's name it finds the binding, and through it the far service's certificate (one owned
by the binding's `user`), for which it wraps the dialog's key. Unless the binding is anonymous,
the sending side also proves itself, signing with its own service's certificate (one owned by
the local service's `owner`). Dialog security (docs/security.md) is what reads it."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from kbroker.core.catalog.values import MAX_SERVICE_NAME, StrictModel


class RemoteServiceBinding(StrictModel):
    """One binding: the far service `to_service` (its name compared exactly, as Service Broker
    compares service names), the database principal `user` that owns its certificate here, and
    ANONYMOUS = ON (`anonymous`): the initiator is not authenticated to the far side."""

    name: str = Field(min_length=1, max_length=128)
    to_service: str = Field(min_length=1, max_length=MAX_SERVICE_NAME)
    user: str = Field(min_length=1, max_length=128)
    anonymous: bool = False


def rebound(bindings: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(binding, the earlier binding, far service) for each (name, to_service) binding of a far
    service an earlier one binds: Service Broker refuses the second, and so does the loader."""
    seen: dict[str, str] = {}
    found: list[tuple[str, str, str]] = []
    for name, to_service in bindings:
        if to_service in seen:
            found.append((name, seen[to_service], to_service))
        else:
            seen[to_service] = name
    return found


def binding_for(bindings: Iterable[RemoteServiceBinding], service: str) -> RemoteServiceBinding | None:
    """The binding for the far service `service`, or None. Two bindings of one service cannot be
    loaded together; applied apart, the one first by name wins, so the answer never depends on
    the order the catalog was read in."""
    return min((b for b in bindings if b.to_service == service), key=lambda b: b.name, default=None)
