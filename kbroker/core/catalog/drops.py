"""DROP MESSAGE TYPE, CONTRACT, QUEUE, SERVICE, ROUTE, XML SCHEMA COLLECTION, BROKER PRIORITY and
REMOTE SERVICE BINDING as pure rules: what refuses a drop (an object still used by another, a
built-in) and the catalog after it; and the rule that a contract's messages are fixed once it is
published (no ALTER CONTRACT).

A drop never leaves a dangling reference: it is refused exactly when the loader's reference
check would fail on the catalog without the object (docs/catalog.md, Dropping objects)."""

from __future__ import annotations

from kbroker.core.catalog.models import BUILTIN_CONTRACTS, BUILTIN_MESSAGE_TYPES, Catalog, Contract
from kbroker.core.catalog.objects import EarlierValidation
from kbroker.errors_catalog import ContractFixedError, DropNotFoundError, DropRefusedError

# the command line's KIND -> (Catalog field, label in messages)
DROP_KINDS: dict[str, tuple[str, str]] = {
    "message-type": ("message_types", "message type"),
    "contract": ("contracts", "contract"),
    "queue": ("queues", "queue"),
    "service": ("services", "service"),
    "route": ("routes", "route"),
    "xml-schema-collection": ("xml_schema_collections", "XML schema collection"),
    "broker-priority": ("broker_priorities", "broker priority"),
    "remote-service-binding": ("remote_service_bindings", "remote service binding"),  # no object names one
}

# kbroker's wording of Service Broker's refusals, by the Catalog field dropped from
REASONS = {
    "message_types": "it is used by {users}: drop or recreate the contracts first",
    "contracts": "it is used by {users}: drop the services or apply them without it, and the priorities, first",
    "queues": "it is used by {users}: drop the services first",
    "xml_schema_collections": "it is used by {users}: drop the message types or change their validation first",
    "services": "it is named by {users}: drop the routes and priorities first",
}


def users_of(catalog: Catalog, field: str, name: str) -> tuple[str, ...]:
    """The objects that name `name` of `field` ("contract X", "service Y"), sorted."""
    found: list[str] = []
    if field == "message_types":
        found = [f"contract {c.name}" for c in catalog.contracts.values() if any(m.type == name for m in c.messages)]
    elif field == "contracts":
        found = [f"service {s.name}" for s in catalog.services.values() if name in s.contracts]
        found += [f"broker priority {p.name}" for p in catalog.broker_priorities.values() if p.contract == name]
    elif field == "queues":
        found = [f"service {s.name}" for s in catalog.services.values() if s.queue == name]
    elif field == "xml_schema_collections":
        found = [f"message type {m.name}" for m in catalog.message_types.values() if m.schema_collection == name]
    elif field == "services":
        found = [f"route {r.name}" for r in catalog.routes.values() if r.address == "LOCAL" and r.service_name == name]
        found += [f"broker priority {p.name}" for p in catalog.broker_priorities.values() if p.local_service == name]
    return tuple(sorted(found))


def check_drop(catalog: Catalog, kind: str, name: str) -> str:
    """The Catalog field `name` is dropped from; DropRefusedError when a built-in or still used,
    DropNotFoundError when there is no such object. KIND is one of DROP_KINDS."""
    field, label = DROP_KINDS[kind]
    if (field == "message_types" and name in BUILTIN_MESSAGE_TYPES) or (
        field == "contracts" and name in BUILTIN_CONTRACTS
    ):
        raise DropRefusedError(label, name, "it is a built-in object")
    if name not in getattr(catalog, field):
        raise DropNotFoundError(label, name, catalog.namespace)
    users = users_of(catalog, field, name)
    if users:
        raise DropRefusedError(label, name, REASONS[field].format(users=", ".join(users)), users)
    return field


def dropped(catalog: Catalog, kind: str, name: str) -> Catalog:
    """The catalog without the object (check_drop's refusals first)."""
    field = check_drop(catalog, kind, name)
    rest = {k: v for k, v in getattr(catalog, field).items() if k != name}
    return catalog.model_copy(update={field: rest})


# A drop: list runs in this order, users before what they use, so one apply can drop a service
# with its queue and contracts, whatever order the files list them in.
DROP_ORDER = (
    "remote-service-binding",
    "broker-priority",
    "route",
    "service",
    "queue",
    "contract",
    "message-type",
    "xml-schema-collection",
)
FIELDS = (
    "message_types",
    "contracts",
    "queues",
    "services",
    "routes",
    "xml_schema_collections",
    "broker_priorities",
    "database_options",
    "remote_service_bindings",
)


def merged(previous: Catalog, files: Catalog) -> Catalog:
    """The catalog once `files` (load_definitions') is published over `previous`."""
    return previous.model_copy(update={f: {**getattr(previous, f), **getattr(files, f)} for f in FIELDS})


def plan_drops(catalog: Catalog, drops: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The drops of an apply's `drop:` list to run, in DROP_ORDER, checked against `catalog`
    (merged(): the published catalog with the files' objects): DropRefusedError before anything
    changes when one is refused; an object already gone is left out (as DROP ... IF EXISTS), so
    applying the same files again changes nothing."""
    planned: list[tuple[str, str]] = []
    for kind, name in sorted(set(drops), key=lambda d: (DROP_ORDER.index(d[0]), d[1])):
        try:
            catalog = dropped(catalog, kind, name)
        except DropNotFoundError:
            continue
        planned.append((kind, name))
    return planned


def _messages(contract: Contract) -> str:
    return ", ".join(f"{m.type} SENT BY {m.sent_by}" for m in contract.messages) or "no messages"


def check_contracts_fixed(previous: Catalog, catalog: Catalog) -> None:
    """ContractFixedError when `catalog` gives a contract `previous` holds other messages (the
    same messages in another order are the same contract)."""
    for name, contract in catalog.contracts.items():
        old = previous.contracts.get(name)
        if old is None or name in BUILTIN_CONTRACTS:
            continue
        if sorted((m.type, m.sent_by) for m in old.messages) != sorted((m.type, m.sent_by) for m in contract.messages):
            raise ContractFixedError(catalog.origins.get(f"contract {name}"), name, _messages(old), _messages(contract))


def stamp_validations(catalog: Catalog, previous: Catalog, now: float) -> Catalog:
    """The catalog `kbroker apply` publishes: a message type whose validation changes keeps the
    one it replaces, in force until `now` (epoch seconds), newest first and at most four, so
    messages queued before an ALTER MESSAGE TYPE are checked on RECEIVE as they were on arrival.
    Unchanged, it keeps what it had: re-applying the same files publishes nothing new."""
    types = dict(catalog.message_types)
    for name, mt in catalog.message_types.items():
        old = previous.message_types.get(name)
        if old is None or name in BUILTIN_MESSAGE_TYPES:
            continue
        earlier = list(old.earlier)
        if (old.validation, old.schema_collection) != (mt.validation, mt.schema_collection):
            replaced = EarlierValidation(until=now, validation=old.validation, schema_collection=old.schema_collection)
            earlier = [replaced, *earlier][: EarlierValidation.MAX]
        types[name] = mt.model_copy(update={"earlier": earlier})
    return catalog.model_copy(update={"message_types": types})


def keep_statuses(catalog: Catalog, previous: Catalog) -> Catalog:
    """The catalog `kbroker apply` publishes: a queue whose definition does not name `status`
    keeps the one published (set by `kbroker queue disable | enable` or poison message handling),
    as ALTER QUEUE changes only what it names; a queue new to the namespace takes its default, ON."""
    queues = dict(catalog.queues)
    for name, q in catalog.queues.items():
        old = previous.queues.get(name)
        if old is not None and "status" not in q.model_fields_set and old.status != q.status:
            queues[name] = q.model_copy(update={"status": old.status})
    return catalog.model_copy(update={"queues": queues})
