"""The catalog topic's records decoded, or rejected (core/rejected.py). Key "<kind>/<name>",
value the object as JSON, a null value deletes it. A kind this kbroker does not know (written by
a newer one) is not an error: it is ignored."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from kbroker.core.catalog.bindings import RemoteServiceBinding
from kbroker.core.catalog.loader import pydantic_reason
from kbroker.core.catalog.models import (
    BrokerEndpoint,
    Contract,
    MessageType,
    Queue,
    Route,
    Service,
    XmlSchemaCollection,
)
from kbroker.core.catalog.priorities import BrokerPriority, DatabaseOption
from kbroker.core.rejected import Rejected, json_object, text_key

# record kind -> (Catalog field, model)
KINDS: dict[str, tuple[str, type[BaseModel]]] = {
    "message_type": ("message_types", MessageType),
    "contract": ("contracts", Contract),
    "queue": ("queues", Queue),
    "service": ("services", Service),
    "route": ("routes", Route),
    "broker_endpoint": ("broker_endpoints", BrokerEndpoint),
    "xml_schema_collection": ("xml_schema_collections", XmlSchemaCollection),
    "broker_priority": ("broker_priorities", BrokerPriority),
    "database_option": ("database_options", DatabaseOption),
    "remote_service_binding": ("remote_service_bindings", RemoteServiceBinding),
}


def catalog_record(key: bytes | None, value: bytes | None) -> tuple[str, str, BaseModel | None] | None:
    """(Catalog field, name, the object or None for a tombstone); None for a kind this kbroker
    does not know, or a tombstone of a key that is no object's (the 5th-tick scan writes those
    over bad records); Rejected for a record that is not a catalog object."""
    if value is None and key is not None:  # a tombstone deletes what its key held, if anything
        kind, sep, name = key.decode(errors="replace").partition("/")
        return (KINDS[kind][0], name, None) if sep and kind in KINDS else None
    kind, sep, name = text_key(key).partition("/")
    if not sep or not name:
        raise Rejected(f"key {kind!r} is not '<kind>/<name>'")
    if kind not in KINDS:
        return None
    field, model = KINDS[kind]
    try:
        obj = model.model_validate(json_object(value))
    except ValidationError as exc:
        raise Rejected(f"not a valid {kind}: {pydantic_reason(exc)}") from None
    if getattr(obj, "name", None) != name:
        raise Rejected(f"the {kind} is named {getattr(obj, 'name', None)!r}, its key {name!r}")
    return field, name, obj
