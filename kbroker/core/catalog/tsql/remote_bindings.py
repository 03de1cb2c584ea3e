"""The part of the mapping for CREATE and ALTER REMOTE SERVICE BINDING: a binding's fields (a
default left out, as the other objects' defaults are)."""

from __future__ import annotations

from typing import Any

from kbroker.core.catalog.tsql.ddl import CreateBinding
from kbroker.core.catalog.tsql.options import Report


def binding_of(current: dict[str, Any], st: CreateBinding, error: Report) -> dict[str, Any] | None:
    """The binding after the statement's WITH list: each option given changes its field (ALTER
    keeps the others); None after an error (a CREATE without USER, at the statement's line)."""
    fields: dict[str, Any] = dict(current) if st.alter else {"name": st.name, "to_service": st.to_service}
    for o in st.options:
        fields[o.key] = o.value == "ON" if o.key == "anonymous" else o.value
    if "user" not in fields:
        error(st.line, f"remote service binding {st.name}: WITH USER = ... is required")
        return None
    binding = {"name": st.name, "to_service": fields["to_service"], "user": fields["user"]}
    return binding | ({"anonymous": True} if fields.get("anonymous") else {})
