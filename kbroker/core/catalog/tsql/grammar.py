"""The grammars of Service Broker's DDL as lark reads them: SPLITTER finds the GO lines that end
a batch (not those inside a string, a bracketed name or a comment), BATCH parses one batch.

BATCH is LALR(1). A statement the importer does not map (`IF EXISTS (...) DROP QUEUE q`, `SET
NOCOUNT ON`, `CREATE ENDPOINT ...`) is `other`: its first word and every token up to the next `;`,
CREATE, ALTER, USE, GRANT, DENY or REVOKE, so a script need not end its statements with `;` (a
permission, `GRANT CREATE QUEUE, ALTER ON SCHEMA::dbo TO u`, names CREATE and ALTER only first
or after a comma). Where a statement may
go on or end (the optional `ON filegroup` after a queue), lark takes the longer reading (a
shift/reduce conflict resolved as a shift, as for a dangling else). A CREATE PROCEDURE (FUNCTION,
TRIGGER, VIEW) is, as in SQL Server, the whole of its batch: `proc_batch` takes every token."""

from __future__ import annotations

from collections.abc import Iterable

# Every keyword BATCH names, matched whatever its case. The contextual lexer reads a keyword as a
# plain NAME where the parser expects a name (`CREATE QUEUE Target` is a queue named Target).
KEYWORDS = (
    "ACTIVATION ADDRESS ALTER ANONYMOUS ANY AS AUTHORIZATION BINDING BROKER BROKER_INSTANCE BY COLLECTION CONTRACT "
    "CONTRACT_NAME CONVERSATION CREATE DATABASE DEFAULT DENY DROP EMPTY EXECUTE EXISTS FOR FUNCTION GRANT IF INITIATOR "
    "LIFETIME "
    "LOCAL_SERVICE_NAME MAX_QUEUE_READERS MESSAGE MIRROR_ADDRESS NONE OFF ON OR OWNER "
    "POISON_MESSAGE_HANDLING PRIORITY PRIORITY_LEVEL PROC PROCEDURE PROCEDURE_NAME QUEUE REMOTE "
    "REMOTE_SERVICE_NAME RETENTION REVOKE ROUTE SCHEMA SELF SENT SERVICE SERVICE_NAME SET STATUS TARGET "
    "TO TRIGGER TYPE USE USER VALID_XML VALIDATION VIEW WELL_FORMED_XML WITH XML"
).split()
# What an `other` statement may not hold: the words that start a statement the importer maps
# (and GRANT, DENY, REVOKE below: each starts a statement of its own).
_STARTS = {"CREATE", "ALTER", "USE"}
# After CREATE: the kinds the importer maps, and those that take their whole batch.
_CREATED = {"MESSAGE", "CONTRACT", "QUEUE", "SERVICE", "ROUTE", "BROKER", "XML", "REMOTE"}
_PROC_KINDS = ("PROCEDURE", "PROC", "FUNCTION", "TRIGGER", "VIEW")
# A permission may name CREATE or ALTER (GRANT CREATE QUEUE, ALTER ON SERVICE::s TO u).
_PERMITS = {"GRANT", "DENY", "REVOKE"}
# After ALTER: the kinds mapped (QUEUE, MESSAGE TYPE, ...); SERVICE and ROUTE are refused by name.
_ALTERED = {"QUEUE", "MESSAGE", "SERVICE", "ROUTE", "XML", "BROKER", "DATABASE", "REMOTE"}
# After DROP: the kinds mapped onto a `drop:` entry (the others are `other_drop`).
_DROPPED = {"MESSAGE", "CONTRACT", "QUEUE", "SERVICE", "ROUTE", "BROKER", "XML", "REMOTE"}


def _alternatives(words: Iterable[str]) -> str:
    return " | ".join(sorted(words))


# The terminals both grammars share. STRING is N'...' or '...' ('' inside is one quote); a
# bracketed name [..]] ..] and a quoted one "..""..". GO ends a batch only alone on its line
# (a count and a -- comment may follow it), as sqlcmd and SSMS read it.
TERMINALS = r"""
STRING.3: /[Nn]?'(?:[^']|'')*'/
BRACKETED.3: /\[(?:[^\]]|\]\])*\]/
QUOTED.3: /"(?:[^"]|"")*"/
LINE_COMMENT.4: /--[^\n]*/
BLOCK_COMMENT.4: /\/\*(?:.|\n)*?\*\//s
"""

SPLITTER = (
    TERMINALS
    + r"""
start: (GO | STRING | BRACKETED | QUOTED | CHUNK | NL)*
GO.5: /(?:\A|(?<=\n))[ \t]*GO(?:[ \t]+[0-9]+)?(?=[ \t]*(?:--[^\n]*)?(?:\r?\n|\Z))/i
NL: /\n/
CHUNK: /[^'"\[\n\/-]+/ | /./
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""
)

_KEYWORD_TERMINALS = "\n".join(f'{k}: "{k}"i' for k in KEYWORDS)
_ANY = _alternatives({*KEYWORDS} - _STARTS - _PERMITS | {"NAME", "STRING", "BRACKETED", "QUOTED", "NUMBER", "OTHER"})

BATCH = (
    TERMINALS
    + r"""
batch: proc_batch | (_statement | ";")*

_statement: use | create_message_type | alter_message_type | create_contract | create_queue
    | alter_queue | create_service | create_route | create_priority | alter_priority | create_binding
    | alter_binding | create_xml_schema
    | alter_xml_schema | alter_database | drop | other_drop | other_create | other_alter | refused_alter | permission | other

proc_batch: (CREATE (OR ALTER)? | ALTER) _proc_kind _tok*
_proc_kind: """
    + _alternatives(_PROC_KINDS)
    + r"""

use: USE name

create_message_type: CREATE MESSAGE TYPE name authorization? validation?
alter_message_type: ALTER MESSAGE TYPE name validation
authorization: AUTHORIZATION name
validation: VALIDATION "=" (NONE | EMPTY | WELL_FORMED_XML | VALID_XML WITH SCHEMA COLLECTION qualified)

create_contract: CREATE CONTRACT name authorization? "(" contract_message ("," contract_message)* ")"
contract_message: object_ref SENT BY (INITIATOR | TARGET | ANY)

create_queue: CREATE QUEUE qualified (WITH queue_option (","? queue_option)*)? filegroup?
alter_queue: ALTER QUEUE qualified (WITH queue_option (","? queue_option)* | maintenance)
maintenance: NAME _any*
filegroup: ON (name | DEFAULT)
queue_option: STATUS "=" on_off                                       -> status
    | RETENTION "=" on_off                                            -> retention
    | ACTIVATION "(" activation_option ("," activation_option)* ")"   -> activation
    | POISON_MESSAGE_HANDLING "(" (STATUS "=" on_off)? ")"            -> poison_message_handling
activation_option: STATUS "=" on_off                                  -> status
    | PROCEDURE_NAME "=" qualified                                    -> procedure_name
    | MAX_QUEUE_READERS "=" NUMBER                                    -> max_queue_readers
    | EXECUTE AS (SELF | OWNER | STRING)                              -> execute_as
    | DROP                                                            -> drop
on_off: ON | OFF

create_service: CREATE SERVICE name authorization? ON QUEUE qualified ("(" object_ref ("," object_ref)* ")")?

create_route: CREATE ROUTE name authorization? WITH route_option ("," route_option)*
route_option: SERVICE_NAME "=" STRING                                 -> service_name
    | BROKER_INSTANCE "=" STRING                                      -> broker_instance
    | LIFETIME "=" NUMBER                                             -> lifetime
    | ADDRESS "=" STRING                                              -> address
    | MIRROR_ADDRESS "=" STRING                                       -> mirror_address

create_priority: CREATE BROKER PRIORITY name FOR CONVERSATION (SET "(" priority_option (","? priority_option)* ")")?
alter_priority: ALTER BROKER PRIORITY name FOR CONVERSATION SET "(" priority_option (","? priority_option)* ")"
priority_option: (CONTRACT_NAME | LOCAL_SERVICE_NAME) "=" (name | ANY)
    | REMOTE_SERVICE_NAME "=" (STRING | ANY)
    | PRIORITY_LEVEL "=" (NUMBER | DEFAULT)

// USER is required in a CREATE: the mapper says so (as ADDRESS in a route).
create_binding: CREATE REMOTE SERVICE BINDING name authorization? TO SERVICE STRING WITH binding_option ("," binding_option)*
alter_binding: ALTER REMOTE SERVICE BINDING name WITH binding_option ("," binding_option)*
binding_option: USER "=" name                                         -> user
    | ANONYMOUS "=" on_off                                            -> anonymous

create_xml_schema: CREATE XML SCHEMA COLLECTION qualified AS _any+
alter_xml_schema: ALTER XML SCHEMA COLLECTION qualified _any+

alter_database: ALTER DATABASE _any*

// Fixed length, so a DROP needs no `;` before the next statement; IF EXISTS is SQL Server 2016's.
drop: DROP (MESSAGE TYPE | CONTRACT | SERVICE | ROUTE | BROKER PRIORITY | REMOTE SERVICE BINDING) _if_exists? name
    | DROP (QUEUE | XML SCHEMA COLLECTION) _if_exists? qualified
_if_exists: IF EXISTS
other_drop: DROP _other_dropped _any*

other_create: CREATE (_other_created | XML NAME) _any*
other_alter: ALTER _other_altered _any*
refused_alter: ALTER (SERVICE | ROUTE) _any*
permission: (GRANT | DENY | REVOKE) (CREATE | ALTER)? (_any | "," (CREATE | ALTER))*
other: _other_head _any*

object_ref: name | DEFAULT
qualified: name ("." name)*
    | name "." "." name                                               -> qualified_dbo
name: NAME | BRACKETED | QUOTED

_tok: _any | CREATE | ALTER | USE | GRANT | DENY | REVOKE | ";"
_any: """
    + _ANY
    + r""" | "(" | ")" | "," | "=" | "."
_other_head: """
    + _alternatives({*KEYWORDS} - _STARTS - _PERMITS - {"DROP"} | {"NAME"})
    + r"""
_other_created: """
    + _alternatives({*KEYWORDS} - _STARTS - _PERMITS - _CREATED - set(_PROC_KINDS) - {"OR"} | {"NAME"})
    + r"""
_other_dropped: """
    + _alternatives({*KEYWORDS} - _STARTS - _PERMITS - _DROPPED | {"NAME"})
    + r"""
_other_altered: """
    + _alternatives({*KEYWORDS} - _STARTS - _PERMITS - _ALTERED - set(_PROC_KINDS) | {"NAME"})
    + r"""

NAME: /(?!\d)[\w@#][\w@$#]*/i
NUMBER: /[0-9]+/
OTHER: /(?!\/\*|--)[^\s\w\['"();,=.]/
%ignore /\s+/
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""
    + _KEYWORD_TERMINALS
    + "\n"
)
