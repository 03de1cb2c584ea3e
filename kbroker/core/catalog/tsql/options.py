"""The parts of the mapping that read options: a queue's ACTIVATION, a route's WITH list, the
queue name rule, and the note (or error) of each statement the catalog has no place for."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kbroker.core.catalog.models import parse_kafka_address
from kbroker.core.catalog.tsql.ddl import Option, Qualified, Severity, Unmapped
from kbroker.core.catalog.values import PROCEDURE_RE
from kbroker.core.topic_keys import queue_name_problem

Report = Callable[[int, str], None]  # (line, why)
PLACEHOLDER_MODULE = "procedures"  # activation.procedure = "procedures:<the procedure's name>", to fill in
_ROUTE_FIELDS = ("service_name", "broker_instance", "address", "mirror_address", "lifetime")


def queue_name_rule(name: str) -> str | None:
    """Why the catalog refuses a queue name, or None: only what Service Broker refuses too."""
    problem = queue_name_problem(name)
    return None if problem is None else f"queue name {name!r} {problem}"


def handler(procedure: Qualified) -> tuple[str, bool]:
    """The `module:function` activation runs for PROCEDURE_NAME, and whether it is a placeholder:
    a procedure written as one name that is already `module:function` (`[pkg.mod:fn]`, as
    to_tsql.py writes one) is taken as it is; any other becomes `procedures:<its name>`."""
    if procedure.bare and PROCEDURE_RE.fullmatch(procedure.name):
        return procedure.name, False
    ident = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in procedure.name) or "_"
    return f"{PLACEHOLDER_MODULE}:{'_' + ident if ident[0].isdigit() else ident}", True


def activation_of(current: dict[str, Any] | None, options: tuple[Option, ...], note: Report) -> dict[str, Any] | None:
    """The queue's activation after ACTIVATION (options): each option given changes its field
    (ALTER QUEUE keeps the others), DROP removes it."""
    if any(o.key == "drop" for o in options):
        return None
    activation: dict[str, Any] = dict(current) if current is not None else {"status": "ON"}
    for o in options:
        if o.key == "status":
            activation["status"] = o.value
        elif o.key == "max_queue_readers":
            activation["max_queue_readers"] = o.value
        elif o.key == "procedure_name":
            assert isinstance(o.value, Qualified)
            procedure, placeholder = handler(o.value)
            activation["procedure"] = procedure
            if placeholder:
                note(
                    o.line,
                    f"PROCEDURE_NAME {'.'.join(p for p in o.value.parts if p)}: activation runs a Python "
                    f"function, not a stored procedure: procedure is the placeholder {procedure!r}; write "
                    "that function (module:function) or put yours there",
                )
        elif o.key == "execute_as":
            shown = str(o.value) if o.value in ("SELF", "OWNER") else f"'{o.value}'"
            note(o.line, f"EXECUTE AS {shown}: not imported: an activated reader runs as its worker's principal")
    return activation


def route_fields(options: tuple[Option, ...], error: Report, note: Report) -> dict[str, Any] | None:
    """A route's fields from its WITH list, in the catalog's order; None after an error. An
    address must be one the catalog routes to: LOCAL, TRANSPORT or kafka://host:port/namespace."""
    given = {o.key: o for o in options}
    if "address" not in given:
        line = options[0].line if options else 0
        error(line, "ADDRESS is required")
        return None
    fields: dict[str, Any] = {}
    for key in _ROUTE_FIELDS:
        o = given.get(key)
        if o is None:
            continue
        value = o.value
        if key in ("address", "mirror_address"):
            value = _address(str(value), key.upper(), o.line, error)
            if value is None:
                return None
        elif key == "broker_instance" and _is_guid(str(value)):
            note(o.line, f"BROKER_INSTANCE {value!r}: a broker instance is a namespace's name in kbroker")
        fields[key] = value
    return fields


def _address(value: str, key: str, line: int, error: Report) -> str | None:
    if value.upper() in ("LOCAL", "TRANSPORT") and key == "ADDRESS":
        return value.upper()
    if parse_kafka_address(value) is not None:
        return value
    forms = "LOCAL, TRANSPORT or kafka://" if key == "ADDRESS" else "kafka://"
    error(
        line,
        f"{key} {value!r} has no kbroker form: a route leads to {forms}host:port[,host:port]/<namespace> "
        "(a namespace of a Kafka cluster); rewrite it in the script",
    )
    return None


def _is_guid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def unmapped_note(st: Unmapped) -> tuple[Severity, str]:
    """The note (or error) for a statement the catalog has no place for."""
    head = f"{st.kind} {st.name}" if st.name else st.text
    kind = st.kind
    if kind == "CREATE XML SCHEMA COLLECTION":
        return "note", f"{head}: XML schema collections are not yet in the catalog: skipped"
    if st.refused:
        return "error", (
            f"{st.text}: not imported: of the ALTER statements only ALTER QUEUE, ALTER MESSAGE TYPE, "
            "ALTER BROKER PRIORITY and ALTER REMOTE SERVICE BINDING are; write the change into the "
            f"{kind.replace('ALTER', 'CREATE')}"
        )
    if kind.endswith(("PROCEDURE", "PROC", "FUNCTION", "TRIGGER", "VIEW")):
        return "note", f"{st.text}: skipped: activation runs a Python module:function (the queue's procedure)"
    if kind.startswith("DROP"):
        return "note", f"{st.text}: skipped: not an object the catalog holds (its drop: list names those)"
    if kind in ("GRANT", "DENY", "REVOKE"):
        return "note", f"{st.text}: skipped: permissions are kbroker grant, deny and revoke (Kafka ACLs)"
    if kind == "CREATE EVENT":
        return "note", f"{st.text}: skipped: external activation is a queue's activation kind: external"
    if kind == "CREATE ENDPOINT":
        return "note", f"{st.text}: skipped: a namespace's endpoint is its Kafka cluster (forwarding: broker_endpoints)"
    return "note", f"{st.text}: skipped: not a statement the catalog has a place for"
