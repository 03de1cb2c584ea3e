"""The statements of a T-SQL script as the parser reads them (parse.py), before any mapping, and
the problems the importer reports: each names a file and a line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

Severity = Literal["error", "note"]


@dataclass(frozen=True)
class Problem:
    """Something the importer could not map: an error (the import fails) or a note (something left
    out, or a placeholder to fill in), as `file:line: message`."""

    file: str
    line: int
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "message": self.message}


@dataclass(frozen=True)
class Qualified:
    """A [database.][schema.]name as written, its parts unquoted ('' for an omitted schema)."""

    parts: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.parts[-1]

    @property
    def qualifiers(self) -> tuple[str, ...]:
        return self.parts[:-1]

    @property
    def bare(self) -> bool:
        """Written as one name: a `[pkg.mod:function]` procedure name says which handler runs."""
        return len(self.parts) == 1


@dataclass(frozen=True)
class Option:
    """One `KEY = value` of a WITH, ACTIVATION or SET list. `key` is lower case
    (status, procedure_name, execute_as, ...); ON/OFF, SELF/OWNER and DEFAULT are upper case, a
    string is unquoted, an ACTIVATION's value is its own options."""

    key: str
    value: Value
    line: int


Value = Union[str, int, Qualified, tuple[Option, ...], None]


@dataclass(frozen=True)
class Statement:
    """A statement: its kind (`CREATE QUEUE`, ...), the object it names and where it starts."""

    kind: str
    name: str
    line: int


@dataclass(frozen=True)
class Use(Statement):
    pass


@dataclass(frozen=True)
class CreateMessageType(Statement):
    owner: str | None = None
    validation: str | None = None  # NONE | EMPTY | WELL_FORMED_XML | VALID_XML
    schema_collection: str | None = None
    alter: bool = False  # ALTER MESSAGE TYPE


@dataclass(frozen=True)
class ContractMessage:
    type: str
    sent_by: str
    line: int


@dataclass(frozen=True)
class CreateContract(Statement):
    owner: str | None = None
    messages: tuple[ContractMessage, ...] = ()


@dataclass(frozen=True)
class CreateQueue(Statement):
    queue: Qualified = Qualified(("",))
    options: tuple[Option, ...] = ()
    filegroup: str | None = None
    alter: bool = False  # ALTER QUEUE ... WITH
    maintenance: str | None = None  # ALTER QUEUE ... REBUILD / REORGANIZE / MOVE TO


@dataclass(frozen=True)
class CreateService(Statement):
    owner: str | None = None
    queue: Qualified = Qualified(("",))
    contracts: tuple[tuple[str, int], ...] = ()  # (contract, line)


@dataclass(frozen=True)
class CreateRoute(Statement):
    owner: str | None = None
    options: tuple[Option, ...] = ()


@dataclass(frozen=True)
class CreateXmlSchemaCollection(Statement):
    """CREATE XML SCHEMA COLLECTION name AS N'<xsd:schema ...>': `schema` is the literal's text,
    None when AS is followed by anything else (a variable, an expression)."""

    schema: str | None = None
    text: str = ""
    alter: bool = False  # ALTER XML SCHEMA COLLECTION ... ADD: one more schema in the collection


@dataclass(frozen=True)
class CreatePriority(Statement):
    """CREATE (or ALTER) BROKER PRIORITY name FOR CONVERSATION SET (...): the options as written
    (contract_name, local_service_name, remote_service_name, priority_level)."""

    options: tuple[Option, ...] = ()
    alter: bool = False


@dataclass(frozen=True)
class CreateBinding(Statement):
    """CREATE REMOTE SERVICE BINDING name TO SERVICE 'svc' WITH ... (or ALTER, which names no
    service): the options as written (user, anonymous)."""

    owner: str | None = None
    to_service: str | None = None
    options: tuple[Option, ...] = ()
    alter: bool = False


@dataclass(frozen=True)
class AlterDatabase(Statement):
    """ALTER DATABASE name SET HONOR_BROKER_PRIORITY ON|OFF; `rest` is the statement's text when
    it sets more than that (the other options are not imported)."""

    value: str = "OFF"
    rest: str = ""


@dataclass(frozen=True)
class Drop(Statement):
    """DROP <kind> [IF EXISTS] name: `drop_kind` is a DROP_KINDS key (drops.py), `target` the
    name as written (a queue's or XML schema collection's may be qualified)."""

    drop_kind: str = ""
    target: Qualified = Qualified(("",))


@dataclass(frozen=True)
class Unmapped(Statement):
    """A statement with no place in the catalog: a procedure, SET, GRANT, another DROP, ...
    `text` is its start as written, for the note."""

    text: str = ""
    refused: bool = False  # ALTER SERVICE / ALTER ROUTE: it changes what the import defines
