"""XML schema collections compiled, and documents checked against them (VALIDATION = VALID_XML
WITH SCHEMA COLLECTION, docs/sources.md item 4): pure logic on the catalog's text, no I/O.

xmlschema (pure Python, XSD 1.0) compiles a collection's schemas as one schema, so each keeps its
target namespace and they may import one another by namespace, as in a SQL Server collection. It
never reads anything but the given text: every source is defused (no DTD entity, no external
entity) and every resource access is refused (allow="none"), so an xs:include or an xs:import's
schemaLocation loads nothing. Compiled schemas (and compile errors) are kept in an LRU cache of
CACHE_SIZE entries keyed by the collection's text: each catalog version's collections compile once
per process, and a check is a dictionary look-up plus the validation."""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from xml.parsers import expat

if TYPE_CHECKING:  # imported when first needed: 0.15 s that a catalog without collections never pays
    from xmlschema import XMLResource, XMLSchema10

CACHE_SIZE = 64  # compiled collections a process keeps, the least recently used dropped first


class SchemaCompileError(ValueError):
    """A collection's schema does not compile: `index` (0-based) says which, `line` where (None
    when xmlschema names no element), `reason` what its error says."""

    def __init__(self, index: int, line: int | None, reason: str):
        self.index, self.line, self.reason = index, line, reason
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"schema {index + 1}: {where}{reason}")


def _resource(source: io.StringIO | io.BytesIO) -> XMLResource:
    # A file-like object, never a str: xmlschema reads a str that is no XML text as a location.
    from xmlschema import XMLResource

    return XMLResource(source, defuse="always", allow="none")


def _no_entities(*_: object) -> None:
    raise ValueError("entities are not allowed")


def _element_lines(text: str | bytes) -> list[int]:
    """The line of each element of `text`, in document order (xmlschema's own elements carry no
    line without lxml). Only ever called on text xmlschema has parsed defused."""
    lines: list[int] = []
    parser = expat.ParserCreate()
    parser.StartElementHandler = lambda _name, _attrs: lines.append(parser.CurrentLineNumber)
    parser.EntityDeclHandler = _no_entities
    try:
        parser.Parse(text, True)
    except (expat.ExpatError, ValueError):
        pass
    return lines


def _line_of(text: str | bytes, resource: XMLResource | None, elem: object) -> int | None:
    """The line of `elem`, an element of `resource` parsed from `text`."""
    if resource is None or elem is None:
        return None
    index = next((i for i, e in enumerate(resource.root.iter()) if e is elem), None)
    lines = _element_lines(text) if index is not None else []
    return lines[index] if index is not None and index < len(lines) else None


def _one_line(text: str) -> str:
    """xmlschema's message without the component and path it appends."""
    return " ".join(text.split("\n\n", 1)[0].split()).rstrip(":")


def compile_schemas(schemas: Sequence[str]) -> XMLSchema10:
    """The collection's schemas as one compiled schema; SchemaCompileError naming the first
    schema that does not parse or compile, its line and xmlschema's reason."""
    import xmlschema
    from xmlschema.exceptions import XMLResourceParseError

    resources: list[Any] = []  # XMLResource, in the list type XMLSchema10 takes
    for index, text in enumerate(schemas):
        try:
            resources.append(_resource(io.StringIO(text)))
        except XMLResourceParseError as exc:  # an ElementTree ParseError: .position
            line = exc.position[0] if getattr(exc, "position", None) else None
            raise SchemaCompileError(index, line, f"not well-formed XML: {_one_line(str(exc))}") from None
        except xmlschema.XMLSchemaException as exc:  # forbidden entities, blocked resources
            raise SchemaCompileError(index, None, _one_line(str(exc))) from None
    try:
        return xmlschema.XMLSchema10(resources, defuse="always", allow="none")
    except xmlschema.XMLSchemaParseError as exc:
        validator = exc.validator
        schema = validator if isinstance(validator, xmlschema.XMLSchemaBase) else getattr(validator, "schema", None)
        source = getattr(schema, "source", None)
        index = next((i for i, r in enumerate(resources) if r is source), 0)
        line = _line_of(schemas[index], resources[index] if source is not None else None, exc.elem)
        raise SchemaCompileError(index, line, _one_line(exc.message)) from None
    except (xmlschema.XMLSchemaException, ValueError) as exc:
        raise SchemaCompileError(0, None, _one_line(str(exc)) or type(exc).__name__) from None


_cache: OrderedDict[tuple[str, ...], XMLSchema10 | SchemaCompileError] = OrderedDict()
_lock = threading.Lock()


def compiled(schemas: Sequence[str]) -> XMLSchema10:
    """compile_schemas through the cache (a compile error is cached too, and raised again)."""
    key = tuple(schemas)
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
    if found is None:
        try:
            found = compile_schemas(key)
        except SchemaCompileError as exc:
            found = exc
        with _lock:
            _cache[key] = found
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(found, SchemaCompileError):
        raise found
    return found


def cache_size() -> int:
    """How many compiled collections the cache holds now."""
    return len(_cache)


def document_error(schemas: Sequence[str], body: bytes) -> str | None:
    """Why `body` (an XML document already found well-formed, and defused) is not valid against
    the collection `schemas`, naming the line and the schema's reason; None when it is valid."""
    import xmlschema

    try:
        schema = compiled(schemas)
    except SchemaCompileError as exc:
        return f"the schema collection does not compile: {exc}"
    try:
        resource = _resource(io.BytesIO(body))
        error = next(iter(schema.iter_errors(resource, use_location_hints=False)), None)
    except xmlschema.XMLSchemaException as exc:
        return _one_line(str(exc)) or type(exc).__name__
    if error is None:
        return None
    line = _line_of(body, resource, error.elem)
    where = f"line {line}: " if line is not None else ""
    at = f" (at {error.path})" if error.path else ""
    return f"{where}{_one_line(error.reason or error.message)}{at}"
