"""A catalog written back as Service Broker DDL: CREATE MESSAGE TYPE, CONTRACT, QUEUE, SERVICE,
ROUTE, REMOTE SERVICE BINDING and BROKER PRIORITY, and ALTER DATABASE ... SET
HONOR_BROKER_PRIORITY, each in the form to_catalog.py reads back into the same objects. What T-SQL
cannot say (JSON validation, partitions, external activation, ...) is a `-- kbroker:` comment
above the statement and one of the notes returned. Pure: a Catalog in, the script's text out."""

from __future__ import annotations

from kbroker.core.catalog.bindings import RemoteServiceBinding
from kbroker.core.catalog.models import BUILTIN_CONTRACTS, BUILTIN_MESSAGE_TYPES, Catalog, Queue, Route, Service
from kbroker.core.catalog.objects import Activation
from kbroker.core.catalog.priorities import ANY, BrokerPriority

_QUEUE_DEFAULTS = Queue(name="q")
_ACTIVATION_DEFAULTS = Activation(status="OFF")


def quote_name(name: str) -> str:
    """A bracketed identifier: `[a]]b]` for a]b."""
    return "[" + name.replace("]", "]]") + "]"


def quote_string(value: str) -> str:
    """A Unicode string literal: N'it''s'."""
    return "N'" + value.replace("'", "''") + "'"


def to_tsql(catalog: Catalog) -> tuple[str, list[str]]:
    """The script creating the catalog's own objects (not the built-ins), and what it could not say."""
    notes: list[str] = []
    batches: list[list[str]] = []

    def statement(batch: list[str], text: str, unsaid: list[str], label: str) -> None:
        for why in unsaid:
            notes.append(f"{label}: {why}")
            batch.append(f"-- kbroker: {why}")
        batch.append(text + ";")

    batch: list[str] = []
    for x in catalog.xml_schema_collections.values():  # before the message types that name them
        name = quote_name(x.name)
        statement(batch, f"CREATE XML SCHEMA COLLECTION {name} AS {quote_string(x.schemas[0])}", [], x.name)
        for more in x.schemas[1:]:  # one schema a statement, so each reads back as itself
            statement(batch, f"ALTER XML SCHEMA COLLECTION {name} ADD {quote_string(more)}", [], x.name)
    for m in catalog.message_types.values():
        if m.name in BUILTIN_MESSAGE_TYPES:
            continue
        validation: str = m.validation
        unsaid: list[str] = []
        if validation == "JSON":
            validation, unsaid = "NONE", ["validation JSON has no T-SQL form (written as NONE)"]
        elif validation == "VALID_XML":
            validation = f"VALID_XML WITH SCHEMA COLLECTION {quote_name(m.schema_collection or '')}"
        statement(
            batch,
            f"CREATE MESSAGE TYPE {quote_name(m.name)} VALIDATION = {validation}",
            unsaid,
            f"message type {m.name}",
        )
    batches.append(batch)

    batch = []
    for c in catalog.contracts.values():
        if c.name in BUILTIN_CONTRACTS:
            continue
        messages = ",\n    ".join(f"{quote_name(m.type)} SENT BY {m.sent_by}" for m in c.messages)
        statement(batch, f"CREATE CONTRACT {quote_name(c.name)} (\n    {messages}\n)", [], f"contract {c.name}")
    batches.append(batch)

    batches.append([s for q in catalog.queues.values() for s in _queue(q, notes)])
    batch = []
    for s in catalog.services.values():
        contracts = f" ({', '.join(quote_name(c) for c in s.contracts)})" if s.contracts else ""
        unsaid = _service_unsaid(s)
        owner = "" if s.owner == "dbo" else f" AUTHORIZATION {quote_name(s.owner)}"  # dbo: the default
        text = f"CREATE SERVICE {quote_name(s.name)}{owner} ON QUEUE {quote_name(s.queue)}{contracts}"
        statement(batch, text, unsaid, f"service {s.name}")
    batches.append(batch)

    batch = []
    for r in catalog.routes.values():
        unsaid = [] if r.profile is None else [f"profile {r.profile} has no T-SQL form"]
        statement(batch, _route(r), unsaid, f"route {r.name}")
    batch += [_binding(b) + ";" for b in catalog.remote_service_bindings.values()]
    batches.append(batch)

    batch = [f"ALTER DATABASE CURRENT SET HONOR_BROKER_PRIORITY {o.value};" for o in catalog.database_options.values()]
    batch += [_priority(p) + ";" for p in catalog.broker_priorities.values()]
    batches.append(batch)

    notes += [f"broker endpoint {e}: has no T-SQL form here (CREATE ENDPOINT)" for e in catalog.broker_endpoints]
    text = "\nGO\n\n".join("\n".join(b) for b in batches if b)
    return (text + "\nGO\n" if text else ""), notes


def _queue(q: Queue, notes: list[str]) -> list[str]:
    options = [f"STATUS = {q.status}", f"RETENTION = {q.retention}"]
    unsaid = [
        f"{field} {getattr(q, field)} has no T-SQL form"
        for field in ("partitions", "max_message_bytes", "stale_after")
        if getattr(q, field) != getattr(_QUEUE_DEFAULTS, field)
    ]
    a = q.activation
    if a is not None:
        parts = [f"STATUS = {a.status}"]
        if a.procedure is not None:
            parts.append(f"PROCEDURE_NAME = {quote_name(a.procedure)}")
        parts += [f"MAX_QUEUE_READERS = {a.max_queue_readers}", "EXECUTE AS SELF"]
        options.append(f"ACTIVATION ({', '.join(parts)})")
        if a.kind != "internal":
            unsaid.append(f"activation kind {a.kind} has no T-SQL form (written as internal)")
        if a.notify_timeout != _ACTIVATION_DEFAULTS.notify_timeout:
            unsaid.append(f"activation notify_timeout {a.notify_timeout:g} has no T-SQL form")
    options.append(f"POISON_MESSAGE_HANDLING (STATUS = {q.poison_message_handling})")
    lines = [f"-- kbroker: {why}" for why in unsaid]
    notes += [f"queue {q.name}: {why}" for why in unsaid]
    lines.append(f"CREATE QUEUE {quote_name(q.name)} WITH\n    " + ",\n    ".join(options) + ";")
    return lines


def _service_unsaid(s: Service) -> list[str]:
    unsaid = []
    if s.remote_senders is not None:
        senders = ", ".join(s.remote_senders) or "(none)"
        unsaid.append(f"remote_senders {senders} has no T-SQL form (GRANT SEND ON SERVICE)")
    if s.remote_security != "none":
        unsaid.append(f"remote_security {s.remote_security} has no T-SQL form (GRANT SEND ON SERVICE, not to public)")
    return unsaid


def _route(r: Route) -> str:
    options = []
    if r.service_name is not None:
        options.append(f"SERVICE_NAME = {quote_string(r.service_name)}")
    if r.broker_instance is not None:
        options.append(f"BROKER_INSTANCE = {quote_string(r.broker_instance)}")
    if r.lifetime is not None:
        options.append(f"LIFETIME = {r.lifetime}")
    options.append(f"ADDRESS = {quote_string(r.address)}")
    if r.mirror_address is not None:
        options.append(f"MIRROR_ADDRESS = {quote_string(r.mirror_address)}")
    return f"CREATE ROUTE {quote_name(r.name)} WITH\n    " + ",\n    ".join(options)


def _binding(b: RemoteServiceBinding) -> str:
    anonymous = "ON" if b.anonymous else "OFF"
    return (
        f"CREATE REMOTE SERVICE BINDING {quote_name(b.name)} TO SERVICE {quote_string(b.to_service)}\n"
        f"    WITH USER = {quote_name(b.user)}, ANONYMOUS = {anonymous}"
    )


def _priority(p: BrokerPriority) -> str:
    contract = "ANY" if p.contract == ANY else quote_name(p.contract)
    local = "ANY" if p.local_service == ANY else quote_name(p.local_service)
    remote = "ANY" if p.remote_service == ANY else quote_string(p.remote_service)
    options = [
        f"CONTRACT_NAME = {contract}",
        f"LOCAL_SERVICE_NAME = {local}",
        f"REMOTE_SERVICE_NAME = {remote}",
        f"PRIORITY_LEVEL = {p.priority}",
    ]
    return f"CREATE BROKER PRIORITY {quote_name(p.name)} FOR CONVERSATION SET (\n    " + ",\n    ".join(options) + "\n)"
