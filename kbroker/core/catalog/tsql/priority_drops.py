"""The parts of the mapping for CREATE and ALTER BROKER PRIORITY and for DROP: a priority's
fields (a default left out, as the other objects' defaults are), the priorities Service Broker
would refuse as alike, the import's section a DROP names, and the references between the
objects imported (those `kbroker apply` checks, and those that refuse a DROP)."""

from __future__ import annotations

from typing import Any

from kbroker.core.catalog.drops import DROP_KINDS
from kbroker.core.catalog.models import BUILTIN_CONTRACTS, BUILTIN_MESSAGE_TYPES
from kbroker.core.catalog.priorities import ANY, DEFAULT_PRIORITY
from kbroker.core.catalog.tsql.ddl import Option
from kbroker.core.catalog.tsql.options import Report

# T-SQL option -> the priority's field, in the catalog's order
_FIELDS = {
    "contract_name": "contract",
    "local_service_name": "local_service",
    "remote_service_name": "remote_service",
    "priority_level": "priority",
}
_DEFAULTS: dict[str, Any] = {"contract": ANY, "local_service": ANY, "remote_service": ANY, "priority": DEFAULT_PRIORITY}
# a DROP_KINDS kind -> the section of the objects it drops, and back
DROP_SECTIONS = {kind: field for kind, (field, _) in DROP_KINDS.items()}
DROP_KIND_OF = {field: kind for kind, field in DROP_SECTIONS.items()}


def priority_of(
    current: dict[str, Any], options: tuple[Option, ...], line: int, error: Report
) -> dict[str, Any] | None:
    """The priority after SET (options): each option given changes its field (ALTER keeps the
    others); None after an error (a PRIORITY_LEVEL not 1-10, at the statement's line)."""
    fields = {k: v for k, v in current.items() if k != "name"}
    for o in options:
        field = _FIELDS[o.key]
        value = DEFAULT_PRIORITY if field == "priority" and o.value == "DEFAULT" else o.value
        if field == "priority" and not (isinstance(value, int) and 1 <= value <= 10):
            error(line, f"broker priority {current['name']}: PRIORITY_LEVEL = {value}: must be 1 to 10, or DEFAULT (5)")
            return None
        fields[field] = value
    return {"name": current["name"]} | {
        f: fields[f] for f in _FIELDS.values() if f in fields and fields[f] != _DEFAULTS[f]
    }


def alike(priorities: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(priority, the earlier one) for each priority with the contract and services of an earlier
    one: Service Broker refuses the second, and so does the loader."""
    seen: dict[tuple[Any, ...], str] = {}
    found: list[tuple[str, str]] = []
    for name, p in priorities.items():
        criteria = tuple(p.get(f, _DEFAULTS[f]) for f in ("contract", "local_service", "remote_service"))
        if criteria in seen:
            found.append((name, seen[criteria]))
        else:
            seen[criteria] = name
    return found


def created_name(name: str, created: dict[str, Any]) -> str:
    """The queue a DROP QUEUE names: as created, else the one created with that name in other
    letter case (found case-insensitively, as a service's queue is)."""
    folded = [q for q in created if q.casefold() == name.casefold()]
    return folded[0] if name not in created and len(folded) == 1 else name


def _named(section: str, obj: dict[str, Any]) -> list[tuple[str, Any]]:
    """(section, name) of each object `obj` of `section` names."""
    if section == "contracts":
        return [("message_types", m["type"]) for m in obj["messages"]]
    if section == "message_types":
        return [("xml_schema_collections", obj.get("schema_collection"))]
    if section == "services":
        return [("queues", obj["queue"])] + [("contracts", c) for c in obj["contracts"]]
    if section == "routes" and obj.get("address") == "LOCAL":
        return [("services", obj.get("service_name"))]
    if section == "broker_priorities":
        return [("contracts", obj.get("contract")), ("services", obj.get("local_service"))]
    return []


def refusal(objects: dict[str, dict[str, dict[str, Any]]], labels: dict[str, str], section: str, name: str) -> str:
    """Why a DROP of `name` is refused, as Service Broker refuses it: a built-in, or an object
    another object the scripts create names ('' when it is not refused)."""
    builtins: dict[str, dict[str, Any]] = {"message_types": BUILTIN_MESSAGE_TYPES, "contracts": BUILTIN_CONTRACTS}
    if name in builtins.get(section, {}):
        return "is a built-in object"
    users = [
        f"{labels[s]} {n}" for s, objs in objects.items() for n, o in objs.items() if (section, name) in _named(s, o)
    ]
    return f"is used by {', '.join(users)}: drop {'it' if len(users) == 1 else 'them'} first" if users else ""


def references(
    objects: dict[str, dict[str, dict[str, Any]]],
    section: str,
    obj: dict[str, Any],
    message_types: dict[str, Any],
    contracts: dict[str, Any],
) -> list[tuple[str, str, dict[str, Any]]]:
    """(section, name, the objects it must be among) of each reference `obj` of `section` makes
    that `kbroker apply` checks; a binding's far service is another namespace's: not checked."""
    if section == "contracts":
        return [("message_types", m["type"], message_types) for m in obj["messages"]]
    if section == "message_types" and "schema_collection" in obj:
        return [("xml_schema_collections", obj["schema_collection"], objects["xml_schema_collections"])]
    if section == "services":
        return [("contracts", c, contracts) for c in obj["contracts"]]
    if section == "routes" and obj["address"] == "LOCAL" and "service_name" in obj:
        return [("services", obj["service_name"], objects["services"])]
    if section == "broker_priorities":  # the remote service is another namespace's: not checked
        refs = [
            ("contracts", obj.get("contract"), contracts),
            ("services", obj.get("local_service"), objects["services"]),
        ]
        return [(k, r, known) for k, r, known in refs if r is not None]
    return []
