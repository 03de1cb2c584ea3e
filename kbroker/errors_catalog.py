"""Typed errors of DROP and of the catalog's fixed parts (kept apart from errors.py, which is at
the house's module size). Each names the object and, for a refusal, what still uses it."""

from __future__ import annotations

from kbroker.errors import CatalogError, DefinitionError


class DropRefusedError(CatalogError):
    """DROP of an object another object still uses (a message type a contract lists, a contract
    or queue a service names, an XML schema collection a message type validates with, a service a
    LOCAL route names), or of a built-in. `users` lists what uses it ("contract X")."""

    def __init__(self, kind: str, name: str, reason: str, users: tuple[str, ...] = ()):
        self.kind, self.name, self.reason, self.users = kind, name, reason, users
        super().__init__(f"cannot drop {kind} {name!r}: {reason}")


class DropNotFoundError(CatalogError):
    """DROP of an object the namespace's catalog does not hold."""

    def __init__(self, kind: str, name: str, namespace: str):
        self.kind, self.name, self.namespace = kind, name, namespace
        super().__init__(f"cannot drop {kind} {name!r}: it does not exist in namespace {namespace!r}")


class ContractFixedError(DefinitionError):
    """An apply that changes the messages of a contract already published: a contract's message
    types are fixed once it is created (Service Broker has no ALTER CONTRACT); drop it and
    create it again."""

    def __init__(self, file: str | None, contract: str, was: str, now: str):
        self.contract = contract
        super().__init__(
            file,
            f"contract {contract}",
            f"a contract's messages are fixed once it is created (there is no ALTER CONTRACT): "
            f"it has {was}, the files give {now}; run 'kbroker drop contract' and apply it again",
        )
