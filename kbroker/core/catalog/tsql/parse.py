"""A T-SQL script read into its Service Broker statements (ddl.py), with lark and the grammars of
grammar.py: the script is cut into batches at its GO lines, and each batch parsed on its own, so a
batch that does not parse is one error and the others are still read. Pure: text in, statements
and problems out."""

from __future__ import annotations

import functools
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from kbroker.core.catalog.tsql import grammar
from kbroker.core.catalog.tsql.ddl import (
    AlterDatabase,
    ContractMessage,
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
    Value,
)

EXCERPT = 60  # characters of an unmapped statement quoted in its note
# How an error names what the parser expected (lark's names of the punctuation).
_SYMBOLS = {"LPAR": "(", "RPAR": ")", "COMMA": ",", "EQUAL": "=", "DOT": ".", "SEMICOLON": ";"}
_NAMES = {"NAME", "BRACKETED", "QUOTED"}
_PROC = {"PROCEDURE", "PROC", "FUNCTION", "TRIGGER", "VIEW"}  # what a proc_batch creates or alters
_UNTERMINATED = {"'": "a string", "[": "a [bracketed] name", '"': 'a "quoted" name', "/": "a /* comment"}


@functools.cache
def _splitter() -> Lark:
    return Lark(grammar.SPLITTER, parser="lalr", lexer="basic")


@functools.cache
def _batch_parser() -> Lark:
    return Lark(
        grammar.BATCH,
        start="batch",
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse_script(text: str, file: str) -> tuple[list[Statement], list[Problem]]:
    """The statements of a script in order, and what could not be parsed (one error per batch)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")
    statements: list[Statement] = []
    problems: list[Problem] = []
    for start, end, go in _batches(text):
        if go is not None and go.split()[-1].isdigit() and int(go.split()[-1]) > 1:
            problems.append(Problem(file, _line(go), "note", f"{go.strip()}: the batch before it is read once"))
        # The batch keeps its place in the file, so the lines lark counts are the file's.
        padded = "\n" * text.count("\n", 0, start) + text[start:end]
        try:
            tree = _batch_parser().parse(padded)
        except UnexpectedInput as exc:
            problems.append(Problem(file, exc.line if exc.line > 0 else _last_line(padded), "error", _why(exc, padded)))
            continue
        statements.extend(_statement(child, padded) for child in tree.children if isinstance(child, Tree))
    return statements, problems


def _batches(text: str) -> list[tuple[int, int, Token | None]]:
    """(start, end, the GO line that ends it or None) of each batch."""
    out: list[tuple[int, int, Token | None]] = []
    start = 0
    for token in _splitter().lex(text):
        if token.type == "GO":
            out.append((start, token.start_pos or 0, token))
            start = token.end_pos or 0
    out.append((start, len(text), None))
    return out


def _line(token: Token) -> int:
    return token.line or 0


def _last_line(text: str) -> int:
    return text.rstrip().count("\n") + 1


def _why(exc: UnexpectedInput, text: str) -> str:
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream or 0]
        what = _UNTERMINATED.get(char)
        if what is not None:
            return f"cannot parse: {what} that does not end"
        return f"cannot parse: unexpected character {char!r}"
    expected = _expected(exc)
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        return f"cannot parse: the batch ends inside a statement{expected}"
    assert isinstance(exc, UnexpectedToken)
    return f"cannot parse: unexpected {exc.token.value!r}{expected}"


def _expected(exc: UnexpectedInput) -> str:
    names = set(getattr(exc, "expected", None) or ())
    choices = sorted({"a name" if n in _NAMES else _SYMBOLS.get(n, n) for n in names})
    if not choices or len(choices) > 6:
        return ""
    return f" (expected {' or '.join(choices)})"


# --- the tree, statement by statement ------------------------------------------------------


def _statement(tree: Tree[Any], text: str) -> Statement:
    line = tree.meta.line
    kind = str(tree.data)
    if kind == "use":
        return Use("USE", _name(tree.children[1]), line)
    if kind in ("create_message_type", "alter_message_type"):
        return _message_type(tree, line)
    if kind == "create_contract":
        messages = tuple(
            ContractMessage(_ref(m.children[0]), _words(m)[-1], m.meta.line) for m in _trees(tree, "contract_message")
        )
        return CreateContract("CREATE CONTRACT", _name(_tree(tree, "name")), line, _owner(tree), messages)
    if kind in ("create_queue", "alter_queue"):
        return _queue(tree, line)
    if kind == "create_service":
        contracts = tuple((_ref(r), r.meta.line) for r in _trees(tree, "object_ref"))
        queue = _qualified(_tree(tree, "qualified", "qualified_dbo"))
        return CreateService("CREATE SERVICE", _name(_tree(tree, "name")), line, _owner(tree), queue, contracts)
    if kind == "create_route":
        options = tuple(
            _option(o) for o in tree.children if isinstance(o, Tree) and o.data not in ("name", "authorization")
        )
        return CreateRoute("CREATE ROUTE", _name(_tree(tree, "name")), line, _owner(tree), options)
    if kind in ("create_priority", "alter_priority"):
        options = tuple(
            Option(_words(o)[0].lower(), _value(o.children[1]), o.meta.line) for o in _trees(tree, "priority_option")
        )
        head = "ALTER BROKER PRIORITY" if kind == "alter_priority" else "CREATE BROKER PRIORITY"
        return CreatePriority(head, _name(_tree(tree, "name")), line, options, kind == "alter_priority")
    if kind in ("create_binding", "alter_binding"):
        return _binding(tree, kind, line)
    if kind == "drop":
        return _drop(tree, line)
    if kind == "alter_database":
        return _database(tree, line, text)
    if kind in ("create_xml_schema", "alter_xml_schema"):
        return _xml_schema(tree, kind, line, text)
    return _unmapped(tree, kind, line, text)


def _binding(tree: Tree[Any], kind: str, line: int) -> CreateBinding:
    """CREATE REMOTE SERVICE BINDING b [AUTHORIZATION o] TO SERVICE 's' WITH ..., or ALTER ... WITH ..."""
    alter = kind == "alter_binding"
    service = next((_unquote(str(t)) for t in tree.children if isinstance(t, Token) and t.type == "STRING"), None)
    options = tuple(_option(o) for o in tree.children if isinstance(o, Tree) and o.data in ("user", "anonymous"))
    head = "ALTER REMOTE SERVICE BINDING" if alter else "CREATE REMOTE SERVICE BINDING"
    return CreateBinding(head, _name(_tree(tree, "name")), line, _owner(tree), service, options, alter)


def _drop(tree: Tree[Any], line: int) -> Drop:
    """DROP MESSAGE TYPE m, DROP QUEUE [schema.]q, ...: the kind's words name its DROP_KINDS key."""
    words = [w for w in _words(tree)[1:] if w not in ("IF", "EXISTS")]
    target = (
        _qualified(_tree(tree, "qualified", "qualified_dbo")) if _trees(tree, "qualified", "qualified_dbo") else None
    )
    if target is None:
        target = Qualified((_name(_tree(tree, "name")),))
    return Drop("DROP " + " ".join(words), target.name, line, "-".join(words).lower(), target)


def _database(tree: Tree[Any], line: int, text: str) -> Statement:
    """ALTER DATABASE d SET ... HONOR_BROKER_PRIORITY ON|OFF ...; any other ALTER DATABASE is unmapped."""
    tokens = [str(t) for t in tree.children if isinstance(t, Token)]
    upper = [t.upper() for t in tokens]
    if "SET" in upper and "HONOR_BROKER_PRIORITY" in upper[upper.index("SET") :]:
        at = upper.index("HONOR_BROKER_PRIORITY", upper.index("SET"))
        if at + 1 < len(upper) and upper[at + 1] in ("ON", "OFF"):
            name = _name(tree.children[2]) if len(tokens) > 2 else ""
            # Anything but `ALTER DATABASE d SET HONOR_BROKER_PRIORITY v` sets more: noted.
            rest = _excerpt(tree, text) if len(tokens) != 6 or upper.index("SET") != 3 else ""
            return AlterDatabase("ALTER DATABASE", name, line, upper[at + 1], rest)
    return _unmapped(tree, "other_alter", line, text)


def _xml_schema(tree: Tree[Any], kind: str, line: int, text: str) -> CreateXmlSchemaCollection:
    """CREATE ... AS N'<schema>' or ALTER ... ADD N'<schema>': the literal, or None for anything else."""
    name = _qualified(_tree(tree, "qualified", "qualified_dbo")).name
    tokens = [t for t in tree.children if isinstance(t, Token)]
    alter = kind == "alter_xml_schema"
    # Past ALTER XML SCHEMA COLLECTION (its four words), or past AS.
    after = tokens[4:] if alter else tokens[[t.type for t in tokens].index("AS") + 1 :]
    if alter:
        after = after[1:] if after and str(after[0]).upper() == "ADD" else []
    schema = _unquote(str(after[0])) if len(after) == 1 and after[0].type == "STRING" else None
    head = "ALTER XML SCHEMA COLLECTION" if alter else "CREATE XML SCHEMA COLLECTION"
    return CreateXmlSchemaCollection(head, name, line, schema, _excerpt(tree, text), alter)


def _message_type(tree: Tree[Any], line: int) -> CreateMessageType:
    alter = tree.data == "alter_message_type"
    validation = schema = None
    for v in _trees(tree, "validation"):
        validation = _words(v)[1]
        if validation == "VALID_XML":
            schema = _qualified(_tree(v, "qualified", "qualified_dbo")).name  # the catalog has no schemas
    kind = "ALTER MESSAGE TYPE" if alter else "CREATE MESSAGE TYPE"
    return CreateMessageType(kind, _name(_tree(tree, "name")), line, _owner(tree), validation, schema, alter)


def _queue(tree: Tree[Any], line: int) -> CreateQueue:
    alter = tree.data == "alter_queue"
    queue = _qualified(_tree(tree, "qualified", "qualified_dbo"))
    options = tuple(
        _option(o) for o in tree.children if isinstance(o, Tree) and o.data not in ("qualified", "qualified_dbo")
    )
    filegroup = maintenance = None
    for o in options:
        if o.key == "filegroup":
            filegroup = str(o.value)
        elif o.key == "maintenance":
            maintenance = str(o.value)
    options = tuple(o for o in options if o.key not in ("filegroup", "maintenance"))
    kind = "ALTER QUEUE" if alter else "CREATE QUEUE"
    return CreateQueue(kind, queue.name, line, queue, options, filegroup, alter, maintenance)


def _option(tree: Tree[Any]) -> Option:
    """A queue, activation or route option (the tree's name is the option's, lower case): its
    value is its last part (`STATUS = ON`, `EXECUTE AS OWNER`), none for `DROP` or `()`."""
    key = str(tree.data)
    value: Value
    if key == "activation":
        value = tuple(_option(o) for o in tree.children if isinstance(o, Tree))
    elif key == "maintenance":
        value = _words(tree)[0].upper()
    else:
        value = _value(tree.children[-1]) if len(tree.children) > 1 else None
    return Option(key, value, tree.meta.line)


def _value(node: Tree[Any] | Token) -> Value:
    if isinstance(node, Tree):
        if node.data == "on_off":
            return str(node.children[0]).upper()
        if node.data in ("qualified", "qualified_dbo"):
            return _qualified(node)
        return _name(node)
    if node.type == "STRING":
        return _unquote(str(node))
    if node.type == "NUMBER":
        return int(str(node))
    return str(node).upper()  # SELF, OWNER, ANY, DEFAULT


def _unmapped(tree: Tree[Any], kind: str, line: int, text: str) -> Unmapped:
    words = _words(tree)
    if kind == "proc_batch":
        made = words[: words.index(next(w for w in words if w in _PROC)) + 1]  # CREATE OR ALTER PROCEDURE
        return Unmapped(" ".join(made), "", line, _excerpt(tree, text))
    two = words[0] in ("CREATE", "ALTER", "DROP") and len(words) > 1
    head = " ".join(w.upper() for w in words[: 2 if two else 1])  # CREATE ENDPOINT, DROP QUEUE, SET, IF
    return Unmapped(head, "", line, _excerpt(tree, text), kind == "refused_alter")


def _excerpt(tree: Tree[Any], text: str) -> str:
    first = " ".join(text[tree.meta.start_pos : tree.meta.end_pos].split("\n", 1)[0].split())
    return first if len(first) <= EXCERPT else first[: EXCERPT - 3] + "..."


def _words(tree: Tree[Any]) -> list[str]:
    """The tree's own tokens, keywords upper case (names as written)."""
    return [str(t).upper() if t.type in grammar.KEYWORDS else str(t) for t in tree.children if isinstance(t, Token)]


def _trees(tree: Tree[Any], *data: str) -> list[Tree[Any]]:
    return [c for c in tree.children if isinstance(c, Tree) and c.data in data]


def _tree(tree: Tree[Any], *data: str) -> Tree[Any]:
    return _trees(tree, *data)[0]


def _owner(tree: Tree[Any]) -> str | None:
    found = _trees(tree, "authorization")
    return _name(found[0].children[1]) if found else None


def _ref(tree: Tree[Any]) -> str:
    """An object_ref or a filegroup's name: a name, or the DEFAULT keyword (the built-in)."""
    child = tree.children[0]
    return _name(child) if isinstance(child, Tree) else "DEFAULT"


def _qualified(tree: Tree[Any]) -> Qualified:
    parts = [_name(c) for c in tree.children if isinstance(c, Tree)]
    if tree.data == "qualified_dbo":  # database..name: the default schema
        parts.insert(1, "")
    return Qualified(tuple(parts))


def _name(node: Tree[Any] | Token) -> str:
    token = node.children[0] if isinstance(node, Tree) else node
    assert isinstance(token, Token)
    value = str(token)
    if token.type == "BRACKETED":
        return value[1:-1].replace("]]", "]")
    if token.type == "QUOTED":
        return value[1:-1].replace('""', '"')
    return value


def _unquote(value: str) -> str:
    """The text of N'...' or '...'."""
    return value[value.index("'") + 1 : -1].replace("''", "'")
