"""Reads catalog definitions from YAML and validates all of them before anything is applied.

A definition file is a mapping of lists:

    message_types: [{name, validation, schema_collection}]
    xml_schema_collections: [{name, schemas: [XSD text], files: [XSD files beside the YAML]}]
    contracts:     [{name, messages: [{type, sent_by}]}]
    queues:        [{name, partitions, retention, status, ..., activation}]
    services:      [{name, queue, contracts, owner}]
    routes:        [{name, service_name, address, broker_instance, lifetime, mirror_address}]
    broker_endpoints: [{name, message_forwarding, message_forward_size}]   (at most one)
    broker_priorities: [{name, contract, local_service, remote_service, priority}]  (priorities.py)
    database_options: [{name: honor_broker_priority, value: ON|OFF}]
    remote_service_bindings: [{name, to_service, user, anonymous}]   (one a far service; bindings.py)
    system_topics: [{name, partitions, config}]     (kbroker/core/catalog/system.yaml)
    drop:          [{kind, name}]   DROP statements, applied after the definitions (drops.py)

Every problem raises DefinitionError(file, "<kind> <name>", one-line reason). References may
cross files of the same load and may name the built-in objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kbroker.config import NAMESPACE_RE
from kbroker.core.catalog.bindings import RemoteServiceBinding, rebound
from kbroker.core.catalog.drops import DROP_KINDS
from kbroker.core.catalog.models import (
    BUILTIN_CONTRACTS,
    BUILTIN_MESSAGE_TYPES,
    TOPIC_RETENTION,
    BrokerEndpoint,
    Catalog,
    Contract,
    MessageType,
    Queue,
    Route,
    Service,
    SystemTopic,
    XmlSchemaCollection,
)
from kbroker.core.catalog.priorities import ANY, BrokerPriority, DatabaseOption
from kbroker.core.catalog.xml_schemas import SchemaCompileError, compiled
from kbroker.errors import DefinitionError

SYSTEM_YAML = Path(__file__).with_name("system.yaml")
SAMPLES = Path(__file__).with_name("samples")  # the expenses sample, shipped in the wheel (`kbroker apply --samples`)

Definition = (
    MessageType
    | XmlSchemaCollection
    | Contract
    | Queue
    | Service
    | Route
    | BrokerEndpoint
    | SystemTopic
    | BrokerPriority
    | DatabaseOption
    | RemoteServiceBinding
)

# top-level key -> (label used in errors, model)
SECTIONS: dict[str, tuple[str, type[Definition]]] = {
    "message_types": ("message type", MessageType),
    "xml_schema_collections": ("XML schema collection", XmlSchemaCollection),
    "contracts": ("contract", Contract),
    "queues": ("queue", Queue),
    "services": ("service", Service),
    "routes": ("route", Route),
    "broker_endpoints": ("broker endpoint", BrokerEndpoint),
    "system_topics": ("system topic", SystemTopic),
    "broker_priorities": ("broker priority", BrokerPriority),
    "database_options": ("database option", DatabaseOption),
    "remote_service_bindings": ("remote service binding", RemoteServiceBinding),
}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def definition_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files named, and every *.yaml/*.yml under the directories named (sorted), once each."""
    if isinstance(paths, (str, Path)):  # one path, not an iterable of characters
        paths = [paths]
    files: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            if not found:
                raise DefinitionError(str(path), None, "directory holds no *.yaml or *.yml files")
        elif path.is_file():
            found = [path]
        else:
            raise DefinitionError(str(path), None, "no such file or directory")
        for f in found:
            if f.resolve() not in seen:  # a file named twice (or via a directory) loads once
                seen.add(f.resolve())
                files.append(f)
    if not files:
        raise DefinitionError(None, None, "no definition files given")
    return files


def pydantic_reason(exc: ValidationError) -> str:
    """pydantic's first error as one short line naming the field."""
    err = exc.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown field {loc!r}"
    if err["type"] == "missing":
        return f"missing required field {loc!r}"
    if err["type"] != "value_error" and not isinstance(err.get("input"), (dict, list)):
        msg += f" (got {err.get('input')!r})"
    return f"{loc}: {msg}" if loc else msg


def _read(file: Path) -> dict[str, list[Any]]:
    data = read_yaml(file)
    if data is None:
        return {}
    return _check_top_level(file, data)


def read_yaml(file: Path) -> Any:
    """Parse one YAML file strictly (a key given twice is an error), or raise DefinitionError."""
    try:
        return yaml.load(file.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except FileNotFoundError:
        raise DefinitionError(str(file), None, "no such file") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise DefinitionError(str(file), None, f"invalid YAML{where}: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise DefinitionError(str(file), None, f"cannot read: {' '.join(str(exc).split())}") from None


def _check_top_level(file: Path, data: Any) -> dict[str, list[Any]]:
    if not isinstance(data, dict):
        raise DefinitionError(str(file), None, "the file must be a mapping of lists (message_types:, queues:, ...)")
    for key, items in data.items():
        if key not in SECTIONS and key != "drop":
            raise DefinitionError(
                str(file), None, f"unknown top-level key {key!r} (expected one of {', '.join([*SECTIONS, 'drop'])})"
            )
        if items is not None and not isinstance(items, list):
            raise DefinitionError(str(file), None, f"{key} must be a list")
    return {k: v or [] for k, v in data.items()}


def _parse(file: Path, key: str, index: int, item: Any) -> tuple[str, Definition]:
    label, model = SECTIONS[key]
    name = item.get("name") if isinstance(item, dict) else None
    obj = f"{label} {name}" if isinstance(name, str) else f"{label} #{index + 1}"
    if not isinstance(item, dict):
        raise DefinitionError(str(file), obj, f"must be a mapping of fields, not {type(item).__name__}")
    if key == "queues" and TOPIC_RETENTION in item:
        raise DefinitionError(
            str(file),
            obj,
            f"{TOPIC_RETENTION} is no longer a setting: a queue topic keeps "
            "every record until its readers have received it, and the worker reclaims "
            "the rest (remove the line)",
        )
    if key == "queues" and "topic_key" in item:
        raise DefinitionError(str(file), obj, "topic_key is set by 'kbroker apply', not in a definition file")
    if key == "message_types" and "earlier" in item:
        raise DefinitionError(str(file), obj, "earlier is kept by 'kbroker apply', not in a definition file")
    if key == "routes" and "created_at" in item:
        # Expiry counts from when apply published the route: a file cannot backdate it.
        raise DefinitionError(str(file), obj, "created_at is set by 'kbroker apply', not in a definition file")
    labels: list[str] = []
    if key == "xml_schema_collections":
        item, labels = _schema_files(file, obj, item)
    try:
        parsed = model.model_validate(item)
    except ValidationError as exc:
        raise DefinitionError(str(file), obj, pydantic_reason(exc)) from None
    if isinstance(parsed, XmlSchemaCollection):
        try:
            compiled(parsed.schemas)
        except SchemaCompileError as exc:
            where = f"line {exc.line}: " if exc.line is not None else ""
            raise DefinitionError(
                str(file), obj, f"{labels[exc.index]} does not compile: {where}{exc.reason}"
            ) from None
    return obj, parsed


def _schema_files(file: Path, obj: str, item: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """An XML schema collection's definition with its `files:` read into `schemas` (after the
    inline ones), and each schema's label for errors ("schema 1", "orders.xsd"). A file is named
    relative to the YAML file and must be inside its directory."""
    inline, files = item.get("schemas", []), item.get("files", [])
    if not isinstance(inline, list) or not isinstance(files, list):
        raise DefinitionError(str(file), obj, "schemas and files must be lists")
    labels = [f"schema {i + 1}" for i in range(len(inline))]
    texts = list(inline)
    home = file.parent.resolve()
    for name in files:
        if not isinstance(name, str) or not name:
            raise DefinitionError(str(file), obj, f"files: {name!r} is no file name")
        path = (home / name).resolve()  # a symbolic link counts where it leads
        if Path(name).is_absolute() or not path.is_relative_to(home):
            what = "is an absolute path" if Path(name).is_absolute() else f"leads outside {home}"
            raise DefinitionError(
                str(file),
                obj,
                f"files: {name!r} {what}: a collection's XSD files are named relative to its YAML "
                "file and must be in its directory or below, so that a catalog reads only its own files",
            )
        try:
            texts.append(path.read_bytes().decode("utf-8-sig"))
        except FileNotFoundError:
            raise DefinitionError(str(file), obj, f"files: {name!r}: no such file ({path})") from None
        except UnicodeDecodeError:
            raise DefinitionError(str(file), obj, f"files: {name!r} is not UTF-8 text") from None
        except OSError as exc:
            raise DefinitionError(str(file), obj, f"files: cannot read {name!r}: {exc.strerror}") from None
        labels.append(name)
    if not texts:
        raise DefinitionError(str(file), obj, "holds no schema: give schemas or files")
    item = {k: v for k, v in item.items() if k != "files"} | {"schemas": texts}
    return item, labels


def load_definitions(paths: Iterable[str | Path], namespace: str) -> Catalog:
    """Load and validate every definition under `paths`; raises DefinitionError on the first problem."""
    if not NAMESPACE_RE.match(namespace or ""):
        raise DefinitionError(
            None, None, f"namespace {namespace!r} must be 1-40 characters of letters, digits, '_' or '-'"
        )
    objects: dict[str, dict[str, Any]] = {key: {} for key in SECTIONS}
    origins: dict[str, str] = {}  # "queue X" -> file that defines it
    builtins: dict[str, dict[str, Any]] = {"message_types": BUILTIN_MESSAGE_TYPES, "contracts": BUILTIN_CONTRACTS}
    drops: list[tuple[str, str]] = []
    for file in definition_files(paths):
        for key, items in _read(file).items():
            if key == "drop":
                drops += _drops(file, items, origins)
                continue
            for index, item in enumerate(items):
                obj, parsed = _parse(file, key, index, item)
                if parsed.name in builtins.get(key, {}):
                    raise DefinitionError(str(file), obj, "is a built-in object and cannot be redefined")
                if parsed.name in objects[key]:
                    raise DefinitionError(str(file), obj, f"duplicate name: already defined in {origins[obj]}")
                objects[key][parsed.name] = parsed
                origins[obj] = str(file)
    _check_references(objects, origins)
    for kind, name in drops:
        field, label = DROP_KINDS[kind]
        if name in objects[field]:
            raise DefinitionError(origins[f"drop {kind} {name}"], f"{label} {name}", "is both defined and dropped")
    return Catalog(
        namespace=namespace,
        message_types=objects["message_types"],
        xml_schema_collections=objects["xml_schema_collections"],
        contracts=objects["contracts"],
        queues=objects["queues"],
        services=objects["services"],
        routes=objects["routes"],
        broker_endpoints=objects["broker_endpoints"],
        broker_priorities=objects["broker_priorities"],
        database_options=objects["database_options"],
        remote_service_bindings=objects["remote_service_bindings"],
        system_topics=objects["system_topics"],
        origins=origins,
        drops=drops,
    )


def _drops(file: Path, items: list[Any], origins: dict[str, str]) -> list[tuple[str, str]]:
    """A file's `drop:` list as (kind, name), each {kind: <a DROP_KINDS kind>, name: ...}."""
    found: list[tuple[str, str]] = []
    for index, item in enumerate(items):
        kind, name = (item.get("kind"), item.get("name")) if isinstance(item, dict) else (None, None)
        if not isinstance(item, dict) or set(item) != {"kind", "name"} or not isinstance(name, str) or not name:
            raise DefinitionError(str(file), f"drop #{index + 1}", "must be a mapping {kind: ..., name: ...}")
        if kind not in DROP_KINDS:
            raise DefinitionError(
                str(file), f"drop #{index + 1}", f"kind {kind!r} is not one of {', '.join(DROP_KINDS)}"
            )
        origins.setdefault(f"drop {kind} {name}", str(file))
        found.append((kind, name))
    return found


def _check_references(objects: dict[str, dict[str, Any]], origins: dict[str, str]) -> None:
    message_types = {**BUILTIN_MESSAGE_TYPES, **objects["message_types"]}
    contracts = {**BUILTIN_CONTRACTS, **objects["contracts"]}

    def missing(obj: str, what: str, name: str) -> DefinitionError:
        return DefinitionError(origins[obj], obj, f"{what} {name!r} is not defined")

    for mt in objects["message_types"].values():
        if mt.schema_collection is not None and mt.schema_collection not in objects["xml_schema_collections"]:
            raise missing(f"message type {mt.name}", "XML schema collection", mt.schema_collection)
    for c in objects["contracts"].values():
        for m in c.messages:
            if m.type not in message_types:
                raise missing(f"contract {c.name}", "message type", m.type)
    for s in objects["services"].values():
        if s.queue not in objects["queues"]:
            raise missing(f"service {s.name}", "queue", s.queue)
        for name in s.contracts:
            if name not in contracts:
                raise missing(f"service {s.name}", "contract", name)
    if len(objects["broker_endpoints"]) > 1:
        names = sorted(objects["broker_endpoints"])
        raise DefinitionError(
            origins[f"broker endpoint {names[1]}"],
            f"broker endpoint {names[1]}",
            f"a namespace has one broker endpoint; {names[0]!r} is already defined",
        )
    _check_priorities(objects, contracts, missing)
    # The far service is another namespace's (not checked); a second binding of it would be ignored.
    twice = rebound((b.name, b.to_service) for b in objects.get("remote_service_bindings", {}).values())
    if twice:
        name, other, service = twice[0]
        obj = f"remote service binding {name}"
        why = f"binds service {service!r}, as remote service binding {other!r} does: a service has one binding"
        raise DefinitionError(origins[obj], obj, why)
    for r in objects["routes"].values():
        # Only a LOCAL route's service must be defined here: a remote route names a service of
        # another namespace (Service Broker checks neither).
        if r.address == "LOCAL" and r.service_name is not None and r.service_name not in objects["services"]:
            raise missing(f"route {r.name}", "service", r.service_name)


def _check_priorities(objects: dict[str, dict[str, Any]], contracts: dict[str, Any], missing: Any) -> None:
    """A priority's contract and local service are this namespace's (or ANY); its remote service
    may be any name. Two priorities with the same three criteria are refused, as Service Broker
    refuses them: which one applied would be a guess."""
    seen: dict[tuple[str, str, str], str] = {}
    for p in objects.get("broker_priorities", {}).values():
        obj = f"broker priority {p.name}"
        if p.contract != ANY and p.contract not in contracts:
            raise missing(obj, "contract", p.contract)
        if p.local_service != ANY and p.local_service not in objects["services"]:
            raise missing(obj, "service", p.local_service)
        criteria = (p.contract, p.local_service, p.remote_service)
        if criteria in seen:
            raise DefinitionError(
                None, obj, f"has the contract and services of broker priority {seen[criteria]!r}: one would be ignored"
            )
        seen[criteria] = p.name


def load_system_topics(path: str | Path = SYSTEM_YAML) -> dict[str, SystemTopic]:
    """The system topics of a namespace, by name (catalog, endpoints, events, ...)."""
    file = Path(path)
    topics: dict[str, SystemTopic] = {}
    for index, item in enumerate(_read(file).get("system_topics", [])):
        obj, parsed = _parse(file, "system_topics", index, item)
        assert isinstance(parsed, SystemTopic)
        if parsed.name in topics:
            raise DefinitionError(str(file), obj, "duplicate name")
        topics[parsed.name] = parsed
    return topics
