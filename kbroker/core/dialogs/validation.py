"""Message-type validation of bodies (VALIDATION = NONE | EMPTY | WELL_FORMED_XML | VALID_XML WITH
SCHEMA COLLECTION, plus JSON).

Runs on SEND, before anything is produced, so a body that fails never reaches a queue, and where a
message arrives (arrival.py, RECEIVE's check of a record another client wrote). XML is parsed with
defusedxml (no DTD entity, no external entity); a schema collection's check is xml_schemas'."""

from __future__ import annotations

from typing import Any

import orjson
from defusedxml import ElementTree as SafeET
from defusedxml.common import DefusedXmlException

from kbroker.core.catalog.models import XmlSchemaCollection
from kbroker.core.catalog.xml_schemas import document_error
from kbroker.errors import MessageValidationError


def validate_body(message_type: str, validation: str, body: bytes, schemas: XmlSchemaCollection | None = None) -> None:
    """MessageValidationError when `body` fails `validation`; `schemas`: VALID_XML's collection
    (Catalog.schema_collection_of)."""
    if validation == "NONE":
        return
    if validation == "EMPTY":
        if body:
            raise MessageValidationError(message_type, validation, f"body has {len(body)} bytes, must be empty")
        return
    if validation == "JSON":
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MessageValidationError(message_type, validation, str(exc).splitlines()[0]) from None
        return
    if validation in ("WELL_FORMED_XML", "VALID_XML"):
        if not body:
            return  # Service Broker accepts an empty body for XML-validated types
        try:
            SafeET.fromstring(body)
        except (SafeET.ParseError, DefusedXmlException) as exc:
            raise MessageValidationError(message_type, validation, str(exc) or type(exc).__name__) from None
        if validation == "VALID_XML":
            if schemas is None:
                raise MessageValidationError(message_type, validation, "no schema collection to validate against")
            why = document_error(schemas.schemas, body)
            if why is not None:
                raise MessageValidationError(message_type, validation, f"schema collection {schemas.name!r}: {why}")
        return
    raise MessageValidationError(message_type, validation, "unknown validation kind")


def to_bytes(body: bytes | str | dict[str, Any] | list[Any] | None) -> bytes:
    """Bodies are bytes on the wire; str is UTF-8, dict/list become JSON."""
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (dict, list)):
        return orjson.dumps(body)
    raise TypeError(f"body must be bytes, str, dict or list, not {type(body).__name__}")
