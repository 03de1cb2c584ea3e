"""Service Broker's DDL (parse.py's statements) mapped onto catalog definitions, the lists a
definition file holds (catalog/loader.py), with a note or an error naming the file and line of
everything that has no place in the catalog. Pure: scripts' text in, definitions and problems out.

What maps to what is docs/catalog.md's "Importing T-SQL". In short: a message type, contract,
queue, service, route, broker priority and remote service binding become the catalog object of the
same name, ALTER QUEUE, ALTER MESSAGE TYPE, ALTER BROKER PRIORITY and ALTER REMOTE SERVICE BINDING
change the object created before them, a DROP is a `drop:` entry (a DROP of an object the scripts
create leaves it out), and a name the catalog refuses is an error (never renamed). Objects are
checked with the catalog's own models and, as `kbroker apply` checks them, their references to
one another."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from kbroker.core.catalog.bindings import rebound
from kbroker.core.catalog.loader import SECTIONS, pydantic_reason
from kbroker.core.catalog.models import BUILTIN_CONTRACTS, BUILTIN_MESSAGE_TYPES, Catalog
from kbroker.core.catalog.tsql import priority_drops as pd
from kbroker.core.catalog.tsql import remote_bindings as rb
from kbroker.core.catalog.tsql.ddl import (
    AlterDatabase,
    CreateBinding,
    CreateContract,
    CreateMessageType,
    CreatePriority,
    CreateQueue,
    CreateRoute,
    CreateService,
    CreateXmlSchemaCollection,
    Drop,
    Option,
    Problem,
    Qualified,
    Statement,
    Unmapped,
    Use,
)
from kbroker.core.catalog.tsql.options import activation_of, queue_name_rule, route_fields, unmapped_note
from kbroker.core.catalog.tsql.parse import parse_script
from kbroker.core.catalog.xml_schemas import SchemaCompileError, compiled

LABELS = {key: label for key, (label, _) in SECTIONS.items()} | {"drop": "drop"}
# the sections an import writes, in SECTIONS' order (no broker endpoints or system topics in T-SQL)
_IMPORTED = tuple(s for s in SECTIONS if s not in ("broker_endpoints", "system_topics"))
_BUILTINS: dict[str, dict[str, Any]] = {"message_types": BUILTIN_MESSAGE_TYPES, "contracts": BUILTIN_CONTRACTS}


@dataclass
class Imported:
    """What an import made: the definitions (section -> objects, in the order the scripts created
    them), the file that created each object, every statement read, and the notes and errors."""

    definitions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # "queue X" -> the script that created it
    statements: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)

    def by_file(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """The definitions split by the script that created each object, scripts in order."""
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for section, objects in self.definitions.items():
            for obj in objects:
                key = f"drop {obj['kind']}" if section == "drop" else LABELS[section]  # "queue X", "drop queue X"
                out.setdefault(self.origins[f"{key} {obj['name']}"], {}).setdefault(section, []).append(obj)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The --json document."""
        return {
            "statements": self.statements,
            "notes": [p.as_dict() for p in self.notes],
            "errors": [p.as_dict() for p in self.errors],
            "catalog": self.definitions,
        }


def import_scripts(scripts: Iterable[tuple[str, str]]) -> Imported:
    """Map the Service Broker DDL of (file name, text) scripts, read in order, onto one catalog."""
    mapper = _Mapper()
    for file, text in scripts:
        mapper.order.setdefault(file, len(mapper.order))
        statements, problems = parse_script(text, file)
        for p in problems:
            mapper.problem(p)
        for st in statements:
            mapper.map(file, st)
    mapper.check()
    return mapper.result()


def render_yaml(definitions: dict[str, list[dict[str, Any]]], sources: Iterable[str]) -> str:
    """A definition file of the objects, with a header naming the scripts they came from."""
    header = (
        f"# Imported by `kbroker import-sql` from {', '.join(sources)}.\n"
        "# Check its notes: an activation procedure is a placeholder to fill in.\n"
    )
    body: str = yaml.safe_dump(definitions, sort_keys=False, allow_unicode=True, width=120)
    return header + body


def catalog_of(imported: Imported, namespace: str) -> Catalog:
    """The definitions as the Catalog `kbroker apply` would publish (models checked, no files)."""
    data: dict[str, Any] = {"namespace": namespace}
    data["drops"] = [(d["kind"], d["name"]) for d in imported.definitions.get("drop", [])]
    for section, objects in imported.definitions.items():
        if section == "drop":
            continue
        model = SECTIONS[section][1]
        data[section] = {o["name"]: model.model_validate(o) for o in objects}
    return Catalog.model_validate(data)


class _Mapper:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in _IMPORTED}
        self.where: dict[tuple[str, str], tuple[str, int]] = {}  # (section, name) -> (file, line)
        self.drops: dict[tuple[str, str], tuple[str, int]] = {}  # (kind, name) -> (file, line)
        self.refused: set[tuple[str, str]] = set()  # names refused: no second error for their use
        self.order: dict[str, int] = {}  # file -> its place among the scripts
        self.out = Imported()

    # --- problems -------------------------------------------------------------------------

    def problem(self, p: Problem) -> None:
        (self.out.errors if p.severity == "error" else self.out.notes).append(p)

    def note(self, file: str, line: int, message: str) -> None:
        self.problem(Problem(file, line, "note", message))

    def error(self, file: str, line: int, message: str) -> None:
        self.problem(Problem(file, line, "error", message))

    # --- statements ------------------------------------------------------------------------

    def map(self, file: str, st: Statement) -> None:
        maps_to: str | None = None
        if isinstance(st, Use):
            self.note(file, st.line, f"USE {st.name}: ignored: the namespace is chosen when applying (--namespace)")
        elif isinstance(st, Unmapped):
            severity, message = unmapped_note(st)
            self.problem(Problem(file, st.line, severity, message))
        else:
            maps_to = self._object(file, st)
        self.out.statements.append(
            {"file": file, "line": st.line, "statement": st.kind, "name": st.name, "maps_to": maps_to}
        )

    def _object(self, file: str, st: Statement) -> str | None:
        owner = getattr(st, "owner", None)
        if owner is not None and not isinstance(st, CreateService):  # a service's owner is its `owner`
            self.note(file, st.line, f"AUTHORIZATION {owner}: only a service has an owner (permissions: kbroker grant)")
        if isinstance(st, CreateMessageType):
            return self._message_type(file, st)
        if isinstance(st, CreateXmlSchemaCollection):
            if st.schema is None:
                self.error(file, st.line, f"{st.text}: only a literal N'...' schema is imported, not a variable")
                return None
            if not st.alter:
                return self._create(file, st, "xml_schema_collections", {"name": st.name, "schemas": [st.schema]})
            found = self.objects["xml_schema_collections"].get(st.name)
            if found is None:
                self.error(file, st.line, f"{st.kind} {st.name}: the collection is not created before it")
                return None
            found["schemas"].append(st.schema)
            return f"XML schema collection {st.name}"
        if isinstance(st, CreateContract):
            messages = [{"type": m.type, "sent_by": m.sent_by} for m in st.messages]
            return self._create(file, st, "contracts", {"name": st.name, "messages": messages})
        if isinstance(st, CreateQueue):
            return self._queue(file, st)
        if isinstance(st, CreatePriority):
            return self._changed(file, st, "broker_priorities", lambda o, e: pd.priority_of(o, st.options, st.line, e))
        if isinstance(st, CreateBinding):
            return self._changed(file, st, "remote_service_bindings", lambda o, e: rb.binding_of(o, st, e))
        if isinstance(st, AlterDatabase):
            return self._database(file, st)
        if isinstance(st, Drop):
            return self._drop(file, st)
        if isinstance(st, CreateService):
            queue = self._queue_ref(file, st.line, st.queue)
            service = {"name": st.name, "queue": queue, "contracts": [c for c, _ in st.contracts]}
            owned = {} if st.owner in (None, "dbo") else {"owner": st.owner}  # dbo: the default, left out
            return self._create(file, st, "services", service | owned)
        assert isinstance(st, CreateRoute)
        if self._once(file, st.options):
            fields = route_fields(st.options, lambda line, why: self.error(file, line, why), self._note_at(file))
            if fields is not None:
                return self._create(file, st, "routes", {"name": st.name, **fields})
        return None

    def _message_type(self, file: str, st: CreateMessageType) -> str | None:
        validation = st.validation
        fields: dict[str, Any] = {"validation": validation or "NONE"}
        if validation == "VALID_XML":
            fields["schema_collection"] = st.schema_collection
        if not st.alter:
            return self._create(file, st, "message_types", {"name": st.name, **fields})
        found = self.objects["message_types"].get(st.name)
        if found is None:
            self.error(file, st.line, f"ALTER MESSAGE TYPE {st.name}: the message type is not created before it")
            return None
        found.pop("schema_collection", None)
        found.update(fields)
        return f"message type {st.name}"

    def _queue(self, file: str, st: CreateQueue) -> str | None:
        if st.maintenance is not None:
            self.note(file, st.line, f"ALTER QUEUE {st.name} {st.maintenance}: skipped: a queue's storage is its topic")
            return None
        if st.filegroup is not None and st.filegroup.upper() != "DEFAULT":
            self.note(file, st.line, f"ON {st.filegroup}: ignored: a queue is a Kafka topic, in no filegroup")
        if not self._once(file, st.options):
            return None
        if st.alter:
            name = self._queue_ref(file, st.line, st.queue, altered=True)
            if name is None:
                return None
            queue = self.objects["queues"][name]
        else:
            self._qualifiers(file, st.line, st.queue)
            rule = queue_name_rule(st.name)
            if rule is not None:
                self.refused.add(("queues", st.name))
                self.error(file, st.line, rule)
                return None
            queue = {"name": st.name, "status": "ON", "retention": "OFF", "poison_message_handling": "ON"}
        for o in st.options:
            if isinstance(o.value, tuple):  # ACTIVATION (...)
                activation = activation_of(queue.get("activation"), o.value, self._note_at(file))
                queue.pop("activation", None)
                if activation is not None:
                    queue["activation"] = activation
            elif o.value is not None:
                queue[o.key] = o.value
        if st.alter:
            return f"queue {queue['name']}"
        return self._create(file, st, "queues", queue)  # any two names have their own topics (names.py)

    def _changed(self, file: str, st: CreatePriority | CreateBinding, section: str, build: Any) -> str | None:
        """A priority or binding as created, or as the ALTER changes the one created before it:
        build(current, error) gives its fields, or None after an error."""
        if not self._once(file, st.options):
            return None
        current = self.objects[section].get(st.name) if st.alter else {"name": st.name}
        if current is None:
            self.error(file, st.line, f"{st.kind} {st.name}: the {LABELS[section]} is not created before it")
            return None
        obj = build(current, lambda line, why: self.error(file, line, why))
        if obj is not None and st.alter:
            self.objects[section][st.name] = obj
            return f"{LABELS[section]} {st.name}"
        return None if obj is None else self._create(file, st, section, obj)

    def _database(self, file: str, st: AlterDatabase) -> str:
        if st.rest:
            self.note(file, st.line, f"{st.rest}: only HONOR_BROKER_PRIORITY is imported, the rest is skipped")
        name = "honor_broker_priority"  # set again: the later value wins, as in the database
        self.objects["database_options"][name] = {"name": name, "value": st.value}
        self.where[("database_options", name)] = (file, st.line)
        self.out.origins[f"database option {name}"] = file
        return f"database option {name}"

    def _drop(self, file: str, st: Drop) -> str | None:
        """A drop: entry, or, of an object created before it, the object left out: the loader
        refuses a name both defined and dropped, and the scripts' net effect is no object."""
        section = pd.DROP_SECTIONS[st.drop_kind]
        if section == "queues":
            self._qualifiers(file, st.line, st.target)
        name = pd.created_name(st.name, self.objects[section]) if section == "queues" else st.name
        label = f"{LABELS[section]} {name}"
        refused = pd.refusal(self.objects, LABELS, section, name)
        if refused:
            self.error(file, st.line, f"{st.kind} {st.name}: cannot drop {label}: it {refused}")
            return None
        if name in self.objects[section]:
            del self.objects[section][name], self.out.origins[label]
            at = ":".join(map(str, self.where.pop((section, name))))
            self.note(file, st.line, f"{st.kind} {st.name}: drops the {label} created at {at}: neither is imported")
            return None
        self.drops.setdefault((st.drop_kind, name), (file, st.line))
        self.out.origins.setdefault(f"drop {st.drop_kind} {name}", file)
        return f"drop {st.drop_kind} {name}"

    def _create(self, file: str, st: Statement, section: str, obj: dict[str, Any]) -> str | None:
        label = f"{LABELS[section]} {st.name}"
        if st.name in _BUILTINS.get(section, {}):
            self.refused.add((section, st.name))
            self.error(file, st.line, f"{label}: is a built-in object and cannot be redefined")
            return None
        earlier = self.objects[section].get(st.name)
        if earlier is not None:
            at = ":".join(map(str, self.where[(section, st.name)]))
            if earlier != obj:
                self.error(file, st.line, f"{label}: created again, differently (first at {at})")
                return None
            self.note(file, st.line, f"{label}: created again as at {at}: imported once")
            return label
        dropped = self.drops.pop((pd.DROP_KIND_OF[section], st.name), None)
        if dropped is not None:  # DROP then CREATE: the object as created (apply replaces it)
            del self.out.origins[f"drop {pd.DROP_KIND_OF[section]} {st.name}"]
            at = ":".join(map(str, dropped))
            self.note(file, st.line, f"{label}: dropped at {at} and created again: imported as created")
        self.objects[section][st.name] = obj
        self.where[(section, st.name)] = (file, st.line)
        self.out.origins[label] = file
        return label

    def _queue_ref(self, file: str, line: int, ref: Qualified, altered: bool = False) -> str | None:
        """The queue a service or ALTER QUEUE names: as created, else the one created with that
        name in other letter case (a queue is a database object, found case-insensitively)."""
        self._qualifiers(file, line, ref)
        queues = self.objects["queues"]
        if ref.name in queues:
            return ref.name
        folded = [q for q in queues if q.casefold() == ref.name.casefold()]
        if len(folded) == 1:
            self.note(file, line, f"queue {ref.name}: the queue created as {folded[0]}")
            return folded[0]
        if ("queues", ref.name) not in self.refused:
            what = f"ALTER QUEUE {ref.name}: the queue" if altered else f"queue {ref.name!r}"
            self.error(file, line, f"{what} is not created in the scripts imported")
        return None if altered else ref.name

    def _qualifiers(self, file: str, line: int, ref: Qualified) -> None:
        if any(p and p.casefold() != "dbo" for p in ref.qualifiers):
            shown = ".".join(ref.parts)
            self.note(file, line, f"{shown}: the queue {ref.name}: the catalog has no databases or schemas")

    def _once(self, file: str, options: tuple[Option, ...]) -> bool:
        seen: set[str] = set()
        for o in options:
            if o.key in seen:
                self.error(file, o.line, f"{o.key.upper()} is given twice")
                return False
            seen.add(o.key)
            if isinstance(o.value, tuple) and not self._once(file, o.value):
                return False
        return True

    def _note_at(self, file: str) -> Any:
        return lambda line, why: self.note(file, line, why)

    # --- the whole -------------------------------------------------------------------------

    def check(self) -> None:
        """Each object against its catalog model, and the references `kbroker apply` checks."""
        message_types = {**BUILTIN_MESSAGE_TYPES, **self.objects["message_types"]}
        contracts = {**BUILTIN_CONTRACTS, **self.objects["contracts"]}
        for section, objects in self.objects.items():
            for name, obj in list(objects.items()):
                file, line = self.where[(section, name)]
                try:
                    SECTIONS[section][1].model_validate(obj)
                except ValidationError as exc:
                    self.error(file, line, f"{LABELS[section]} {name}: {pydantic_reason(exc)}")
                    continue
                if section == "xml_schema_collections":
                    try:
                        compiled(obj["schemas"])  # as apply compiles it: the XSD's own error, with its line
                    except SchemaCompileError as exc:
                        self.error(file, line, f"{LABELS[section]} {name}: {exc}")
                for kind, ref, known in pd.references(self.objects, section, obj, message_types, contracts):
                    if ref not in known and (kind, ref) not in self.refused:
                        missing = f"{LABELS[kind]} {ref!r} is not created in the scripts imported"
                        self.error(file, line, f"{LABELS[section]} {name}: {missing}")
        for name, other in pd.alike(self.objects["broker_priorities"]):
            file, line = self.where[("broker_priorities", name)]
            self.error(file, line, f"broker priority {name}: has the contract and services of {other!r}")
        bindings = self.objects["remote_service_bindings"]
        for name, other, service in rebound((n, b["to_service"]) for n, b in bindings.items()):
            file, line = self.where[("remote_service_bindings", name)]
            self.error(file, line, f"remote service binding {name}: binds service {service!r}, as {other!r} does")

    def result(self) -> Imported:
        for problems in (self.out.notes, self.out.errors):
            problems.sort(key=lambda p: (self.order[p.file], p.line))
        self.out.definitions = {s: list(objs.values()) for s, objs in self.objects.items() if objs}
        if self.drops:
            self.out.definitions["drop"] = [{"kind": k, "name": n} for k, n in self.drops]
        return self.out
