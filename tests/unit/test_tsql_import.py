"""`kbroker import-sql`: Service Broker's T-SQL DDL into catalog definitions (core/catalog/tsql/).
The samples in tests/data/tsql/ are retyped from Microsoft's Service Broker tutorials (one
database, two databases, internal activation, two instances) and reference examples; each test
asserts the exact catalog, and the notes and errors with their lines."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kbroker.cli import main
from kbroker.core.catalog.drops import DROP_KINDS
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import BUILTIN_MESSAGE_TYPES, DEFAULT, Catalog, Route
from kbroker.core.catalog.tsql.to_catalog import Imported, catalog_of, import_scripts, render_yaml
from kbroker.core.catalog.tsql.to_tsql import to_tsql
from tests.helpers import DATA, SAMPLES

TSQL = DATA / "tsql"
USE_NOTE = "USE {}: ignored: the namespace is chosen when applying (--namespace)"
XML = "WELL_FORMED_XML"


def imported(name: str) -> Imported:
    path = TSQL / name
    return import_scripts([(path.name, path.read_text())])


def script(text: str) -> Imported:
    return import_scripts([("s.sql", text)])


def notes(result: Imported) -> list[tuple[int, str]]:
    return [(p.line, p.message) for p in result.notes]


def errors(result: Imported) -> list[tuple[int, str]]:
    return [(p.line, p.message) for p in result.errors]


def queue(name: str, status: str = "ON", retention: str = "OFF", poison: str = "ON", **more: object) -> dict:
    return {"name": name, "status": status, "retention": retention, "poison_message_handling": poison, **more}


# --- the tutorials' scripts ------------------------------------------------------------------


def test_the_single_database_tutorial():
    result = imported("single_database.sql")
    assert result.definitions == {
        "message_types": [
            {"name": "//AWDB/1DBSample/RequestMessage", "validation": XML},
            {"name": "//AWDB/1DBSample/ReplyMessage", "validation": XML},
        ],
        "contracts": [
            {
                "name": "//AWDB/1DBSample/SampleContract",
                "messages": [
                    {"type": "//AWDB/1DBSample/RequestMessage", "sent_by": "INITIATOR"},
                    {"type": "//AWDB/1DBSample/ReplyMessage", "sent_by": "TARGET"},
                ],
            }
        ],
        "queues": [queue("TargetQueue1DB"), queue("InitiatorQueue1DB")],
        "services": [
            {
                "name": "//AWDB/1DBSample/TargetService",
                "queue": "TargetQueue1DB",
                "contracts": ["//AWDB/1DBSample/SampleContract"],
            },
            {"name": "//AWDB/1DBSample/InitiatorService", "queue": "InitiatorQueue1DB", "contracts": []},
        ],
    }
    assert notes(result) == [(3, USE_NOTE.format("AdventureWorks2008R2"))]
    assert result.errors == []
    assert [(s["line"], s["statement"], s["maps_to"]) for s in result.statements] == [
        (3, "USE", None),
        (6, "CREATE MESSAGE TYPE", "message type //AWDB/1DBSample/RequestMessage"),
        (9, "CREATE MESSAGE TYPE", "message type //AWDB/1DBSample/ReplyMessage"),
        (14, "CREATE CONTRACT", "contract //AWDB/1DBSample/SampleContract"),
        (22, "CREATE QUEUE", "queue TargetQueue1DB"),
        (24, "CREATE SERVICE", "service //AWDB/1DBSample/TargetService"),
        (30, "CREATE QUEUE", "queue InitiatorQueue1DB"),
        (32, "CREATE SERVICE", "service //AWDB/1DBSample/InitiatorService"),
    ]


def test_the_between_databases_tutorial_imports_the_objects_both_databases_create_once():
    result = imported("between_databases.sql")
    contract = {
        "name": "//BothDB/2DBSample/SimpleContract",
        "messages": [
            {"type": "//BothDB/2DBSample/RequestMessage", "sent_by": "INITIATOR"},
            {"type": "//BothDB/2DBSample/ReplyMessage", "sent_by": "TARGET"},
        ],
    }
    assert result.definitions == {
        "message_types": [
            {"name": "//BothDB/2DBSample/RequestMessage", "validation": XML},
            {"name": "//BothDB/2DBSample/ReplyMessage", "validation": XML},
        ],
        "contracts": [contract],
        "queues": [queue("TargetQueue2DB"), queue("InitiatorQueue2DB")],
        "services": [
            {
                "name": "//TgtDB/2DBSample/TargetService",
                "queue": "TargetQueue2DB",
                "contracts": ["//BothDB/2DBSample/SimpleContract"],
            },
            {"name": "//InitDB/2DBSample/InitiatorService", "queue": "InitiatorQueue2DB", "contracts": []},
        ],
    }
    again = "created again as at between_databases.sql:{}: imported once"
    assert notes(result) == [
        (3, USE_NOTE.format("master")),
        (5, "ALTER DATABASE InstTargetDB SET ENABLE_BROKER: skipped: not a statement the catalog has a place for"),
        (8, USE_NOTE.format("InstTargetDB")),
        (24, "InstTargetDB.dbo.TargetQueue2DB: the queue TargetQueue2DB: the catalog has no databases or schemas"),
        (31, USE_NOTE.format("InstInitiatorDB")),
        (33, "message type //BothDB/2DBSample/RequestMessage: " + again.format(10)),
        (35, "message type //BothDB/2DBSample/ReplyMessage: " + again.format(12)),
        (39, "contract //BothDB/2DBSample/SimpleContract: " + again.format(16)),
        (
            47,
            "InstInitiatorDB.dbo.InitiatorQueue2DB: the queue InitiatorQueue2DB: the catalog has no databases or schemas",
        ),
    ]
    assert result.errors == []


def test_the_internal_activation_tutorial_gets_a_placeholder_handler_and_notes():
    result = imported("internal_activation.sql")
    assert result.definitions["queues"] == [
        queue(
            "TargetQueueIntAct",
            activation={"status": "ON", "procedure": "procedures:TargetActivProc", "max_queue_readers": 10},
        ),
        queue("InitiatorQueueIntAct"),
    ]
    assert [s["name"] for s in result.definitions["services"]] == [
        "//AWDB/InternalAct/TargetService",
        "//AWDB/InternalAct/InitiatorService",
    ]
    assert notes(result) == [
        (3, USE_NOTE.format("AdventureWorks2008R2")),
        (
            29,
            "CREATE PROCEDURE TargetActivProc: skipped: activation runs a Python module:function (the queue's procedure)",
        ),
        (
            72,
            "PROCEDURE_NAME TargetActivProc: activation runs a Python function, not a stored procedure: procedure is "
            "the placeholder 'procedures:TargetActivProc'; write that function (module:function) or put yours there",
        ),
        (74, "EXECUTE AS SELF: not imported: an activated reader runs as its worker's principal"),
    ]
    assert result.errors == []


def test_the_between_instances_tutorial_route_to_a_tcp_address_is_an_error_naming_its_line():
    result = imported("between_instances.sql")
    assert errors(result) == [
        (
            36,
            "ADDRESS 'TCP://MyInitiatorComputer:4022' has no kbroker form: a route leads to LOCAL, TRANSPORT or "
            "kafka://host:port[,host:port]/<namespace> (a namespace of a Kafka cluster); rewrite it in the script",
        )
    ]
    assert result.definitions["routes"] == [
        {"name": "InstTargetDBRoute", "service_name": "//TgtDB/2InstSample/TargetService", "address": "LOCAL"}
    ]
    skipped = [line for line, message in notes(result) if "skipped" in message]
    assert skipped == [5, 8, 17, 32]  # IF EXISTS ... DROP ENDPOINT, CREATE ENDPOINT, MASTER KEY, GRANT
    assert not [m for _, m in notes(result) if m.startswith("AUTHORIZATION")]  # the service's owner is kept
    assert result.definitions["services"][0]["owner"] == "TargetUser"


EXPENSE_XSD = """<?xml version="1.0" encoding="UTF-16" ?>
  <xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema"
     targetNamespace="http://Adventure-Works.com/Expenses"
     xmlns:expense="http://Adventure-Works.com/Expenses"
     elementFormDefault="qualified">
    <xsd:element name="ExpenseReport" />
  </xsd:schema>"""


def xsd(namespace: str, element: str = "order") -> str:
    return (
        f'<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" targetNamespace="{namespace}">'
        f'<xsd:element name="{element}" type="xsd:string"/></xsd:schema>'
    )


def test_xml_schema_collections_created_altered_and_named_by_message_types():
    text = (
        f"CREATE XML SCHEMA COLLECTION dbo.Orders AS N'{xsd('urn:a')}';\n"
        f"ALTER XML SCHEMA COLLECTION dbo.Orders ADD N'{xsd('urn:b')}';\nGO\n"
        "CREATE MESSAGE TYPE [//x/Order] VALIDATION = VALID_XML WITH SCHEMA COLLECTION dbo.Orders;\n"
        "CREATE MESSAGE TYPE [//x/Other] VALIDATION = VALID_XML WITH SCHEMA COLLECTION Missing;\n"
        "DECLARE @x xml = N'<a/>';\nCREATE XML SCHEMA COLLECTION Var AS @x;\n"
        'CREATE XML SCHEMA COLLECTION Broken AS N\'<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema">'
        '<xsd:element name="e" type="xsd:nosuch"/></xsd:schema>\';\n'
        "ALTER XML SCHEMA COLLECTION Nobody ADD N'<a/>';\n"
    )
    result = import_scripts([("s.sql", text)])
    assert result.definitions["xml_schema_collections"][0] == {
        "name": "Orders",
        "schemas": [xsd("urn:a"), xsd("urn:b")],
    }
    assert result.definitions["message_types"][0] == {
        "name": "//x/Order",
        "validation": "VALID_XML",
        "schema_collection": "Orders",
    }
    errors = {e.line: e.message for e in result.errors}
    assert errors[5] == "message type //x/Other: XML schema collection 'Missing' is not created in the scripts imported"
    assert (
        errors[7] == "CREATE XML SCHEMA COLLECTION Var AS @x: only a literal N'...' schema is imported, not a variable"
    )
    assert errors[8].startswith("XML schema collection Broken: ") and "nosuch" in errors[8]
    assert errors[9] == "ALTER XML SCHEMA COLLECTION Nobody: the collection is not created before it"
    assert sorted(errors) == [5, 7, 8, 9]


def test_the_expenses_reference_examples_map_every_option():
    result = imported("expenses.sql")
    assert result.definitions == {
        "message_types": [
            {
                "name": "//Adventure-Works.com/Expenses/SubmitExpense",
                "validation": "VALID_XML",
                "schema_collection": "ExpenseReport",
            },
            {"name": "//Adventure-Works.com/Expenses/ExpenseApproved", "validation": "EMPTY"},
            {"name": "//Adventure-Works.com/Expenses/Note", "validation": XML},  # ALTER MESSAGE TYPE
        ],
        "xml_schema_collections": [{"name": "ExpenseReport", "schemas": [EXPENSE_XSD]}],
        "contracts": [
            {
                "name": "//Adventure-Works.com/Expenses/ExpenseSubmission",
                "messages": [
                    {"type": "//Adventure-Works.com/Expenses/SubmitExpense", "sent_by": "INITIATOR"},
                    {"type": "//Adventure-Works.com/Expenses/ExpenseApproved", "sent_by": "TARGET"},
                    {"type": "//Adventure-Works.com/Expenses/Note", "sent_by": "ANY"},
                ],
            }
        ],
        "queues": [
            # CREATE: STATUS OFF, activation ON by default; ALTER QUEUE: STATUS ON, activation OFF.
            queue(
                "ExpenseQueue",
                retention="ON",
                poison="OFF",
                activation={"status": "OFF", "procedure": "procedures:expense_procedure", "max_queue_readers": 5},
            ),
            queue(
                "Expense-Replies",
                activation={
                    "status": "ON",
                    "procedure": "kbroker.samples.expenses:process_claims",  # already a module:function
                    "max_queue_readers": 2,
                },
            ),
        ],
        "services": [
            {
                "name": "//Adventure-Works.com/Expenses",
                "queue": "ExpenseQueue",
                "contracts": ["//Adventure-Works.com/Expenses/ExpenseSubmission", "DEFAULT"],
            },
            {"name": "//Adventure-Works.com/Employees", "queue": "Expense-Replies", "contracts": []},
        ],
        "routes": [
            {
                "name": "ExpenseRoute",
                "service_name": "//Adventure-Works.com/Expenses",
                "broker_instance": "expenses",
                "address": "kafka://kafka1:9092,kafka2:9092/expenses",
                "mirror_address": "kafka://standby:9092/expenses-mirror",
                "lifetime": 259200,
            },
            {"name": "Local Expenses", "service_name": "//Adventure-Works.com/Employees", "address": "LOCAL"},
        ],
        "broker_priorities": [  # LOCAL_SERVICE_NAME = ANY, the default: not written
            {
                "name": "ExpensePriority",
                "contract": "//Adventure-Works.com/Expenses/ExpenseSubmission",
                "remote_service": "//Adventure-Works.com/Expenses",
                "priority": 7,
            }
        ],
    }
    assert result.errors == []
    by_line = dict(notes(result))
    assert sorted(by_line) == [14, 28, 32, 34, 40]
    assert [m for line, m in notes(result) if line == 14] == [
        "AUTHORIZATION dbo: only a service has an owner (permissions: kbroker grant)",
    ]
    assert by_line[28] == "ON PRIMARY: ignored: a queue is a Kafka topic, in no filegroup"
    assert by_line[34] == "EXECUTE AS 'ExpenseUser': not imported: an activated reader runs as its worker's principal"


# --- the produced YAML, the catalog loader and the CLI ------------------------------------------


@pytest.mark.parametrize(
    "name", ["single_database.sql", "between_databases.sql", "internal_activation.sql", "expenses.sql"]
)
def test_the_yaml_loads_with_the_catalog_loader_kbroker_apply_uses(tmp_path: Path, name: str):
    result = imported(name)
    out = tmp_path / "catalog.yaml"
    out.write_text(render_yaml(result.definitions, [name]))
    loaded = load_definitions([out], "imported")
    assert loaded.model_dump() == catalog_of(result, "imported").model_dump()
    assert set(loaded.queues) == {q["name"] for q in result.definitions["queues"]}


def test_import_sql_writes_one_file_per_script_that_kbroker_apply_validates(tmp_path: Path):
    out = tmp_path / "out"
    scripts = [str(TSQL / "single_database.sql"), str(TSQL / "internal_activation.sql")]
    result = CliRunner().invoke(main, ["import-sql", *scripts, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"wrote {out / 'single_database.yaml'}: 2 message types, 1 contract, 2 queues, 2 services",
        f"wrote {out / 'internal_activation.yaml'}: 2 message types, 1 contract, 2 queues, 2 services",
    ]
    assert result.stderr.splitlines()[0] == f"kbroker: note: {scripts[0]}:3: " + USE_NOTE.format("AdventureWorks2008R2")
    catalog = load_definitions([out], "tutorials")
    assert catalog.queue("TargetQueueIntAct").activation.procedure == "procedures:TargetActivProc"
    assert catalog.service_accepts("//AWDB/1DBSample/TargetService", "//AWDB/1DBSample/SampleContract")


def test_import_sql_prints_the_yaml_and_json_names_the_statements_notes_and_errors():
    path = str(TSQL / "single_database.sql")
    text = CliRunner().invoke(main, ["import-sql", path])
    assert text.exit_code == 0
    assert text.stdout.startswith(f"# Imported by `kbroker import-sql` from {path}.\n")
    assert "- name: TargetQueue1DB\n  status: 'ON'\n" in text.stdout

    doc = json.loads(CliRunner().invoke(main, ["import-sql", path, "--json"]).stdout)
    assert set(doc) == {"statements", "notes", "errors", "catalog", "written"}
    assert doc["notes"] == [{"file": path, "line": 3, "message": USE_NOTE.format("AdventureWorks2008R2")}]
    assert doc["errors"] == [] and doc["written"] == []
    assert doc["catalog"] == imported("single_database.sql").definitions
    assert doc["statements"][1] == {
        "file": path,
        "line": 6,
        "statement": "CREATE MESSAGE TYPE",
        "name": "//AWDB/1DBSample/RequestMessage",
        "maps_to": "message type //AWDB/1DBSample/RequestMessage",
    }


def test_import_sql_errors_are_one_line_each_exit_1_and_write_nothing(tmp_path: Path):
    path = str(TSQL / "between_instances.sql")
    result = CliRunner().invoke(main, ["import-sql", path, "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        f"kbroker: error: {path}:36: ADDRESS 'TCP://MyInitiatorComputer:4022' has no kbroker form: a route leads to "
        "LOCAL, TRANSPORT or kafka://host:port[,host:port]/<namespace> (a namespace of a Kafka cluster); "
        "rewrite it in the script"
    ]
    assert result.stdout == "" and not (tmp_path / "out").exists()
    doc = CliRunner().invoke(main, ["import-sql", path, "--json"])
    assert doc.exit_code == 1 and json.loads(doc.stdout)["errors"][0]["line"] == 36

    missing = CliRunner().invoke(main, ["import-sql", str(tmp_path / "nope.sql")])
    assert (missing.exit_code, missing.stderr) == (1, f"kbroker: error: {tmp_path / 'nope.sql'}: no such file\n")
    latin = tmp_path / "latin.sql"
    latin.write_bytes("CREATE QUEUE Caf\xe9".encode("latin-1"))
    bad = CliRunner().invoke(main, ["import-sql", str(latin)])
    assert bad.stderr == f"kbroker: error: {latin}: cannot read: not UTF-8 text, nor UTF-16 with a byte order mark\n"


def test_import_sql_reads_a_utf16_script_as_ssms_saves_it(tmp_path: Path):
    path = tmp_path / "unicode.sql"
    path.write_bytes("CREATE QUEUE Orders;\r\nGO\r\n".encode("utf-16"))  # a byte order mark, CRLF lines
    doc = json.loads(CliRunner().invoke(main, ["import-sql", str(path), "--json"]).stdout)
    assert doc["catalog"] == {"queues": [queue("Orders")]}


def test_two_scripts_are_one_catalog_and_an_object_stays_with_the_script_that_created_it():
    result = import_scripts(
        [
            (
                "types.sql",
                "CREATE MESSAGE TYPE [//x/Request]\nCREATE CONTRACT [//x/C] ([//x/Request] SENT BY INITIATOR)",
            ),
            (
                "queues.sql",
                "CREATE QUEUE Q\nCREATE SERVICE [//x/S] ON QUEUE Q ([//x/C])\nALTER QUEUE q WITH STATUS = OFF",
            ),
        ]
    )
    assert result.errors == []
    assert result.by_file() == {
        "types.sql": {
            "message_types": [{"name": "//x/Request", "validation": "NONE"}],
            "contracts": [{"name": "//x/C", "messages": [{"type": "//x/Request", "sent_by": "INITIATOR"}]}],
        },
        "queues.sql": {
            "queues": [queue("Q", status="OFF")],
            "services": [{"name": "//x/S", "queue": "Q", "contracts": ["//x/C"]}],
        },
    }
    assert notes(result) == [(3, "queue q: the queue created as Q")]  # a database object: any letter case


# --- the syntax a script may use ------------------------------------------------------------


def test_go_ends_a_batch_only_alone_on_its_line_outside_strings_names_and_comments():
    result = script(
        "CREATE QUEUE q1 /* a comment\nGO\nthat goes on */ CREATE QUEUE q2 -- GO\n"
        "CREATE MESSAGE TYPE [two\nGO\nlines]\n"
        "  go  \n"  # a GO line, in any case and indented
        "CREATE ROUTE r WITH SERVICE_NAME = N'//a\nGO\n', ADDRESS = N'kafka://h:9092/ns'\n"
        "GO 3 -- a count, and a comment\n"
        "create queue q3\n"
    )
    assert [q["name"] for q in result.definitions["queues"]] == ["q1", "q2", "q3"]
    assert result.definitions["message_types"] == [{"name": "two\nGO\nlines", "validation": "NONE"}]
    assert result.definitions["routes"] == [{"name": "r", "service_name": "//a\nGO\n", "address": "kafka://h:9092/ns"}]
    assert result.errors == []
    assert notes(result) == [(11, "GO 3: the batch before it is read once")]


def test_names_strings_and_keywords_as_service_broker_writes_them():
    result = script(
        'CREATE MESSAGE TYPE "quoted ""name"""\n'
        "CREATE MESSAGE TYPE [a]]b] VALIDATION = none\n"
        "create contract [c] ([a]]b] sent by any, [DEFAULT] SENT BY TARGET)\n"
        "CrEaTe QuEuE Target WITH status = off\n"  # a keyword as a name, keywords in any case
        "CREATE QUEUE [Status]\n"
        "CREATE SERVICE [it's] ON QUEUE Target ([c], [DEFAULT])\n"
        "CREATE ROUTE r WITH SERVICE_NAME = N'it''s', ADDRESS = 'local'\n"
    )
    assert result.errors == []
    assert result.definitions == {
        "message_types": [{"name": 'quoted "name"', "validation": "NONE"}, {"name": "a]b", "validation": "NONE"}],
        "contracts": [
            {"name": "c", "messages": [{"type": "a]b", "sent_by": "ANY"}, {"type": "DEFAULT", "sent_by": "TARGET"}]}
        ],
        "queues": [queue("Target", status="OFF"), queue("Status")],
        "services": [{"name": "it's", "queue": "Target", "contracts": ["c", "DEFAULT"]}],
        "routes": [{"name": "r", "service_name": "it's", "address": "LOCAL"}],
    }


def test_permissions_may_name_create_and_alter_and_each_starts_its_own_statement():
    result = script(
        "GRANT CREATE QUEUE, ALTER ON SCHEMA::dbo TO u\nCREATE QUEUE q\nDENY SEND ON SERVICE::[s] TO u\n"
        "REVOKE ALTER ANY USER FROM u\nCREATE QUEUE r\n"
    )
    assert [q["name"] for q in result.definitions["queues"]] == ["q", "r"]
    permissions = "skipped: permissions are kbroker grant, deny and revoke (Kafka ACLs)"
    assert notes(result) == [
        (1, f"GRANT CREATE QUEUE, ALTER ON SCHEMA::dbo TO u: {permissions}"),
        (3, f"DENY SEND ON SERVICE::[s] TO u: {permissions}"),
        (4, f"REVOKE ALTER ANY USER FROM u: {permissions}"),
    ]


def test_statements_the_catalog_has_no_place_for_are_notes_and_the_rest_still_maps():
    result = script(
        "SET NOCOUNT ON;\n"
        "IF NOT EXISTS (SELECT * FROM sys.service_queues WHERE name = N'q') CREATE QUEUE q\n"
        "DROP ENDPOINT [old]\n"
        "CREATE EVENT NOTIFICATION n ON QUEUE q FOR QUEUE_ACTIVATION TO SERVICE 'ext', 'current database'\n"
        "ALTER QUEUE q REBUILD WITH (MAXDOP = 2)\n"
        "ALTER QUEUE q WITH ACTIVATION (STATUS = ON, PROCEDURE_NAME = [usp-handle q], MAX_QUEUE_READERS = 1)\n"
        "ALTER QUEUE q WITH ACTIVATION (DROP)\n"
    )
    assert result.errors == []
    assert result.definitions == {"queues": [queue("q")]}
    assert notes(result) == [
        (1, "SET NOCOUNT ON: skipped: not a statement the catalog has a place for"),
        (
            2,
            "IF NOT EXISTS (SELECT * FROM sys.service_queues WHERE nam...: skipped: not a statement the catalog has a place for",
        ),
        (3, "DROP ENDPOINT [old]: skipped: not an object the catalog holds (its drop: list names those)"),
        (
            4,
            "CREATE EVENT NOTIFICATION n ON QUEUE q FOR QUEUE_ACTIVATI...: skipped: external activation is a "
            "queue's activation kind: external",
        ),
        (5, "ALTER QUEUE q REBUILD: skipped: a queue's storage is its topic"),
        (
            6,
            "PROCEDURE_NAME usp-handle q: activation runs a Python function, not a stored procedure: procedure is "
            "the placeholder 'procedures:usp_handle_q'; write that function (module:function) or put yours there",
        ),
    ]


# --- errors: each names the line and why, and nothing is renamed --------------------------


def test_any_queue_name_service_broker_takes_is_imported_as_it_is():
    result = script(
        "CREATE QUEUE [dbo].[Expense Queue]\nCREATE SERVICE [//s] ON QUEUE [Expense Queue]\n"
        "CREATE QUEUE [orders.eu]\nCREATE QUEUE orders_eu\nCREATE QUEUE [Заказы [EU]]]\n"
    )
    assert errors(result) == []
    assert [q["name"] for q in result.definitions["queues"]] == [
        "Expense Queue",
        "orders.eu",
        "orders_eu",
        "Заказы [EU]",
    ]
    assert result.definitions["services"][0]["queue"] == "Expense Queue"


def test_a_queue_name_longer_than_a_sysname_is_an_error_naming_the_rule():
    result = script(f"CREATE QUEUE [{'q' * 129}]\nCREATE SERVICE [//s] ON QUEUE [{'q' * 129}]\n")
    assert errors(result) == [(1, f"queue name {'q' * 129!r} must be 1-128 characters")]  # the service: no second error
    assert "queues" not in result.definitions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "CREATE QUEUE q\nCREATE QUEUE q WITH STATUS = OFF",
            (2, "queue q: created again, differently (first at s.sql:1)"),
        ),
        ("CREATE MESSAGE TYPE [DEFAULT]", (1, "message type DEFAULT: is a built-in object and cannot be redefined")),
        ("CREATE SERVICE s ON QUEUE nowhere", (1, "queue 'nowhere' is not created in the scripts imported")),
        (
            "ALTER QUEUE nowhere WITH STATUS = OFF",
            (1, "ALTER QUEUE nowhere: the queue is not created in the scripts imported"),
        ),
        (
            "ALTER MESSAGE TYPE m VALIDATION = EMPTY",
            (1, "ALTER MESSAGE TYPE m: the message type is not created before it"),
        ),
        (
            "CREATE QUEUE q\nCREATE SERVICE s ON QUEUE q (nothing)",
            (2, "service s: contract 'nothing' is not created in the scripts imported"),
        ),
        (
            "CREATE MESSAGE TYPE m\n\nCREATE CONTRACT c ([m] SENT BY TARGET)",
            (3, "contract c: messages: at least one message type must be sent by INITIATOR or ANY"),
        ),
        (
            "CREATE QUEUE q WITH\n  ACTIVATION (STATUS = ON, MAX_QUEUE_READERS = 2)",
            (1, "queue q: activation: procedure is required for internal activation with status ON"),
        ),
        ("CREATE QUEUE q WITH STATUS = ON,\n  STATUS = OFF", (2, "STATUS is given twice")),
        (
            "CREATE ROUTE r WITH LIFETIME = 0, ADDRESS = 'TRANSPORT'",
            (1, "route r: lifetime: Input should be greater than 0 (got 0)"),
        ),
        (
            "CREATE ROUTE r WITH SERVICE_NAME = 's', ADDRESS = 'kafka://h:1/ns',\n MIRROR_ADDRESS = 'TCP://m:4022'",
            (
                2,
                "MIRROR_ADDRESS 'TCP://m:4022' has no kbroker form: a route leads to kafka://host:port[,host:port]"
                "/<namespace> (a namespace of a Kafka cluster); rewrite it in the script",
            ),
        ),
        (
            "CREATE ROUTE r WITH SERVICE_NAME = 's', ADDRESS = 'LOCAL'",
            (1, "route r: service 's' is not created in the scripts imported"),
        ),
        ("CREATE ROUTE r WITH SERVICE_NAME = 's'", (1, "ADDRESS is required")),
        (
            "CREATE SERVICE s ON QUEUE q\nALTER SERVICE s (ADD CONTRACT c)",
            (
                2,
                "ALTER SERVICE s (ADD CONTRACT c): not imported: of the ALTER statements only ALTER QUEUE, "
                "ALTER MESSAGE TYPE, ALTER BROKER PRIORITY and ALTER REMOTE SERVICE BINDING are; write the "
                "change into the CREATE SERVICE",
            ),
        ),
    ],
)
def test_what_cannot_be_mapped_is_an_error_naming_its_line(text: str, expected: tuple[int, str]):
    assert expected in errors(script(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CREATE QUEUE q WITH STATUS = MAYBE", (1, "cannot parse: unexpected 'MAYBE' (expected OFF or ON)")),
        (
            "CREATE QUEUE q WITH\n",
            (
                1,
                "cannot parse: the batch ends inside a statement (expected ACTIVATION or "
                "POISON_MESSAGE_HANDLING or RETENTION or STATUS)",
            ),
        ),
        ("CREATE QUEUE 'q'", (1, "cannot parse: unexpected \"'q'\" (expected a name)")),
        (
            "CREATE MESSAGE TYPE m\nCREATE CONTRACT c ([m] SENT BY INITIATOR",
            (2, "cannot parse: the batch ends inside a statement (expected ) or ,)"),
        ),
        ("\n\nSELECT 'no end", (3, "cannot parse: a string that does not end")),
        ("CREATE QUEUE [q", (1, "cannot parse: a [bracketed] name that does not end")),
        ("CREATE QUEUE q /* no end", (1, "cannot parse: a /* comment that does not end")),
        ("SET NOCOUNT ON\nCREATE SERVICE s ON q", (2, "cannot parse: unexpected 'q' (expected QUEUE)")),
    ],
)
def test_a_batch_that_does_not_parse_is_one_error_naming_its_line(text: str, expected: tuple[int, str]):
    assert errors(script(text)) == [expected]


def test_the_batches_around_one_that_does_not_parse_are_still_imported():
    result = script("CREATE QUEUE a\nGO\nCREATE QUEUE b WITH RETENTION = MAYBE\nCREATE QUEUE c\nGO\nCREATE QUEUE d\n")
    assert errors(result) == [(3, "cannot parse: unexpected 'MAYBE' (expected OFF or ON)")]
    assert [q["name"] for q in result.definitions["queues"]] == ["a", "d"]


# --- the writer, and the round trip ----------------------------------------------------------


def test_to_tsql_writes_the_samples_and_notes_what_t_sql_cannot_say():
    catalog = load_definitions([SAMPLES / "expenses.yaml"], "expenses")
    text, unsaid = to_tsql(catalog)
    assert unsaid == [
        "message type //Adventure-Works.com/Expenses/ExpenseClaim: validation JSON has no T-SQL form (written as NONE)",
        "message type //Adventure-Works.com/Expenses/ExpenseApproval: validation JSON has no T-SQL form (written as NONE)",
    ]
    assert text.splitlines()[:2] == [
        "-- kbroker: validation JSON has no T-SQL form (written as NONE)",
        "CREATE MESSAGE TYPE [//Adventure-Works.com/Expenses/ExpenseClaim] VALIDATION = NONE;",
    ]
    assert (
        "CREATE QUEUE [ExpenseQueue] WITH\n    STATUS = ON,\n    RETENTION = OFF,\n    ACTIVATION (STATUS = OFF, "
        "PROCEDURE_NAME = [kbroker.samples.expenses:process_claims], MAX_QUEUE_READERS = 2, EXECUTE AS SELF),\n"
        "    POISON_MESSAGE_HANDLING (STATUS = ON);\n"
    ) in text
    back = import_scripts([("expenses.sql", text)])
    assert back.errors == []
    expected = catalog.model_dump()
    for name in expected["message_types"]:
        if expected["message_types"][name]["validation"] == "JSON":
            expected["message_types"][name]["validation"] = "NONE"
    assert catalog_of(back, "expenses").model_dump() == expected


def test_to_tsql_notes_the_settings_that_have_no_t_sql_form():
    catalog = Catalog.model_validate(
        {
            "namespace": "n",
            "queues": {"q": {"name": "q", "partitions": 8, "activation": {"kind": "external", "status": "ON"}}},
            "services": {"s": {"name": "s", "queue": "q", "remote_senders": ["eu"]}},
            "routes": {"r": {"name": "r", "address": "kafka://h:1/eu", "profile": "eu"}},
        }
    )
    assert to_tsql(catalog)[1] == [
        "queue q: partitions 8 has no T-SQL form",
        "queue q: activation kind external has no T-SQL form (written as internal)",
        "service s: remote_senders eu has no T-SQL form (GRANT SEND ON SERVICE)",
        "route r: profile eu has no T-SQL form",
    ]


# --- broker priorities, HONOR_BROKER_PRIORITY and DROP ----------------------------------------

PRIORITY_SCRIPT = """CREATE MESSAGE TYPE m
CREATE CONTRACT premier (m SENT BY INITIATOR)
CREATE QUEUE q
CREATE SERVICE sender ON QUEUE q (premier)
CREATE BROKER PRIORITY PremierCustomer FOR CONVERSATION
  SET (CONTRACT_NAME = premier, LOCAL_SERVICE_NAME = sender,
       REMOTE_SERVICE_NAME = N'receiver', PRIORITY_LEVEL = 7);
CREATE BROKER PRIORITY Everyone FOR CONVERSATION;
CREATE BROKER PRIORITY [Far away] FOR CONVERSATION
  SET (CONTRACT_NAME = ANY, REMOTE_SERVICE_NAME = 'far' PRIORITY_LEVEL = DEFAULT)
ALTER BROKER PRIORITY PremierCustomer FOR CONVERSATION SET (LOCAL_SERVICE_NAME = ANY, PRIORITY_LEVEL = 9)
"""


def test_broker_priorities_map_with_their_defaults_left_out_and_alter_changes_what_it_names(tmp_path: Path):
    result = script(PRIORITY_SCRIPT)
    assert result.errors == [] and result.notes == []
    assert result.definitions["broker_priorities"] == [
        # ALTER: LOCAL_SERVICE_NAME back to ANY (left out), PRIORITY_LEVEL 9; the rest as created
        {"name": "PremierCustomer", "contract": "premier", "remote_service": "receiver", "priority": 9},
        {"name": "Everyone"},
        {"name": "Far away", "remote_service": "far"},  # ANY and DEFAULT (5) are the defaults
    ]
    statements = [(s["line"], s["statement"], s["maps_to"]) for s in result.statements[4:]]
    assert statements == [
        (5, "CREATE BROKER PRIORITY", "broker priority PremierCustomer"),
        (8, "CREATE BROKER PRIORITY", "broker priority Everyone"),
        (9, "CREATE BROKER PRIORITY", "broker priority Far away"),
        (11, "ALTER BROKER PRIORITY", "broker priority PremierCustomer"),
    ]
    out = tmp_path / "p.yaml"
    out.write_text(render_yaml(result.definitions, ["s.sql"]))
    loaded = load_definitions([out], "p")
    assert loaded.model_dump() == catalog_of(result, "p").model_dump()
    assert {
        n: (p.contract, p.local_service, p.remote_service, p.priority) for n, p in loaded.broker_priorities.items()
    } == {
        "PremierCustomer": ("premier", "ANY", "receiver", 9),
        "Everyone": ("ANY", "ANY", "ANY", 5),
        "Far away": ("ANY", "ANY", "far", 5),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "CREATE BROKER PRIORITY p FOR CONVERSATION\n  SET (PRIORITY_LEVEL = 11)",
            [(1, "broker priority p: PRIORITY_LEVEL = 11: must be 1 to 10, or DEFAULT (5)")],
        ),
        (
            "\nCREATE BROKER PRIORITY p FOR CONVERSATION SET (PRIORITY_LEVEL = 0)",
            [(2, "broker priority p: PRIORITY_LEVEL = 0: must be 1 to 10, or DEFAULT (5)")],
        ),
        (
            "CREATE BROKER PRIORITY p FOR CONVERSATION\nALTER BROKER PRIORITY p FOR CONVERSATION\n SET (PRIORITY_LEVEL = 42)",
            [(2, "broker priority p: PRIORITY_LEVEL = 42: must be 1 to 10, or DEFAULT (5)")],
        ),
        (
            "ALTER BROKER PRIORITY p FOR CONVERSATION SET (PRIORITY_LEVEL = 3)",
            [(1, "ALTER BROKER PRIORITY p: the broker priority is not created before it")],
        ),
        (
            "CREATE BROKER PRIORITY p FOR CONVERSATION SET (CONTRACT_NAME = c)",
            [(1, "broker priority p: contract 'c' is not created in the scripts imported")],
        ),
        (
            "CREATE BROKER PRIORITY p FOR CONVERSATION SET (LOCAL_SERVICE_NAME = s)",
            [(1, "broker priority p: service 's' is not created in the scripts imported")],
        ),
        (
            "CREATE BROKER PRIORITY p FOR CONVERSATION SET (PRIORITY_LEVEL = 2,\n PRIORITY_LEVEL = 3)",
            [(2, "PRIORITY_LEVEL is given twice")],
        ),
        (
            "CREATE BROKER PRIORITY a FOR CONVERSATION SET (REMOTE_SERVICE_NAME = 'r')\n"
            "CREATE BROKER PRIORITY b FOR CONVERSATION SET (REMOTE_SERVICE_NAME = 'r', PRIORITY_LEVEL = 1)",
            [(2, "broker priority b: has the contract and services of 'a'")],
        ),
        (
            "CREATE BROKER PRIORITY a FOR CONVERSATION SET (PRIORITY_LEVEL = 2)\n"
            "CREATE BROKER PRIORITY a FOR CONVERSATION SET (PRIORITY_LEVEL = 3)",
            [(2, "broker priority a: created again, differently (first at s.sql:1)")],
        ),
        (
            "DROP CONTRACT [DEFAULT]",
            [(1, "DROP CONTRACT DEFAULT: cannot drop contract DEFAULT: it is a built-in object")],
        ),
        (
            "CREATE QUEUE q\nCREATE SERVICE s ON QUEUE q\nDROP QUEUE q",
            [(3, "DROP QUEUE q: cannot drop queue q: it is used by service s: drop it first")],
        ),
    ],
)
def test_priority_and_drop_errors_name_the_statement_line(text: str, expected: list[tuple[int, str]]):
    result = script(text)
    assert errors(result) == expected


def test_alter_database_set_honor_broker_priority_is_a_database_option_and_the_other_options_are_notes():
    result = script(
        "ALTER DATABASE CURRENT SET HONOR_BROKER_PRIORITY ON\n"
        "ALTER DATABASE orders SET ENABLE_BROKER;\n"
        "ALTER DATABASE [orders] SET TRUSTWORTHY ON\n"
        "ALTER DATABASE orders SET NEW_BROKER, HONOR_BROKER_PRIORITY OFF\n"
        "ALTER DATABASE orders MODIFY FILE (NAME = f, SIZE = 10MB)\n"
    )
    assert result.errors == []
    assert result.definitions == {"database_options": [{"name": "honor_broker_priority", "value": "OFF"}]}
    assert notes(result) == [
        (2, "ALTER DATABASE orders SET ENABLE_BROKER: skipped: not a statement the catalog has a place for"),
        (3, "ALTER DATABASE [orders] SET TRUSTWORTHY ON: skipped: not a statement the catalog has a place for"),
        (
            4,
            "ALTER DATABASE orders SET NEW_BROKER, HONOR_BROKER_PRIORI...: only HONOR_BROKER_PRIORITY is "
            "imported, the rest is skipped",
        ),
        (
            5,
            "ALTER DATABASE orders MODIFY FILE (NAME = f, SIZE = 10MB): skipped: not a statement the catalog "
            "has a place for",
        ),
    ]
    assert [s["maps_to"] for s in result.statements] == [
        "database option honor_broker_priority",
        None,
        None,
        "database option honor_broker_priority",
        None,
    ]
    on = script("ALTER DATABASE CURRENT SET HONOR_BROKER_PRIORITY ON;")
    assert (on.definitions, on.notes) == ({"database_options": [{"name": "honor_broker_priority", "value": "ON"}]}, [])
    assert catalog_of(on, "n").database_options["honor_broker_priority"].value == "ON"


def test_drops_of_objects_not_created_are_drop_entries_the_loader_takes(tmp_path: Path):
    result = script(
        "DROP MESSAGE TYPE [//orders/m]\n"
        "DROP CONTRACT c\n"
        "DROP QUEUE dbo.q DROP SERVICE s;\n"
        "DROP ROUTE [r 1]\n"
        "DROP BROKER PRIORITY p DROP REMOTE SERVICE BINDING [to far]\n"
        "DROP XML SCHEMA COLLECTION sales.x\n"
        "DROP QUEUE IF EXISTS q2; DROP SERVICE IF EXISTS s\n"
        "IF EXISTS (SELECT * FROM sys.services WHERE name = N'old') DROP SERVICE old;\n"
        "DROP ENDPOINT e\n"
    )
    assert result.errors == []
    assert result.definitions == {
        "drop": [
            {"kind": "message-type", "name": "//orders/m"},
            {"kind": "contract", "name": "c"},
            {"kind": "queue", "name": "q"},
            {"kind": "service", "name": "s"},  # dropped twice: one entry
            {"kind": "route", "name": "r 1"},
            {"kind": "broker-priority", "name": "p"},
            {"kind": "remote-service-binding", "name": "to far"},
            {"kind": "xml-schema-collection", "name": "x"},
            {"kind": "queue", "name": "q2"},
        ]
    }
    assert {d["kind"] for d in result.definitions["drop"]} == set(DROP_KINDS)
    assert [line for line, _ in notes(result)] == [8, 9]  # IF EXISTS (SELECT ...) DROP, DROP ENDPOINT: skipped
    assert result.statements[2]["maps_to"] == "drop queue q"
    out = tmp_path / "drops.yaml"
    out.write_text(render_yaml(result.definitions, ["s.sql"]))
    assert load_definitions([out], "d").drops == [(d["kind"], d["name"]) for d in result.definitions["drop"]]
    assert catalog_of(result, "d").drops == load_definitions([out], "d").drops


def test_a_drop_of_an_object_the_scripts_create_leaves_it_out_and_a_create_after_a_drop_keeps_it(tmp_path: Path):
    first = (
        "CREATE MESSAGE TYPE m\nCREATE CONTRACT c (m SENT BY ANY)\nCREATE QUEUE Orders\n"
        "CREATE SERVICE s ON QUEUE Orders (c)\nCREATE BROKER PRIORITY p FOR CONVERSATION SET (CONTRACT_NAME = c)\n"
        "DROP QUEUE gone\n"
    )
    second = (
        "DROP BROKER PRIORITY p\nDROP SERVICE s\nDROP QUEUE dbo.orders\n"  # the queue in other letter case
        "CREATE QUEUE gone WITH STATUS = OFF\n"
    )
    result = import_scripts([("a.sql", first), ("b.sql", second)])
    assert result.errors == []
    assert result.definitions == {
        "message_types": [{"name": "m", "validation": "NONE"}],
        "contracts": [{"name": "c", "messages": [{"type": "m", "sent_by": "ANY"}]}],
        "queues": [queue("gone", status="OFF")],
    }
    assert [(p.file, p.line, p.message) for p in result.notes] == [
        ("b.sql", 1, "DROP BROKER PRIORITY p: drops the broker priority p created at a.sql:5: neither is imported"),
        ("b.sql", 2, "DROP SERVICE s: drops the service s created at a.sql:4: neither is imported"),
        ("b.sql", 3, "DROP QUEUE orders: drops the queue Orders created at a.sql:3: neither is imported"),
        ("b.sql", 4, "queue gone: dropped at a.sql:6 and created again: imported as created"),
    ]
    assert result.by_file() == {
        "a.sql": {k: v for k, v in result.definitions.items() if k != "queues"},
        "b.sql": {"queues": [queue("gone", status="OFF")]},
    }
    (tmp_path / "a.sql").write_text(first)
    (tmp_path / "b.sql").write_text(second + "DROP ROUTE old\n")
    out = tmp_path / "out"
    run = CliRunner().invoke(main, ["import-sql", str(tmp_path / "a.sql"), str(tmp_path / "b.sql"), "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert run.stdout.splitlines() == [
        f"wrote {out / 'a.yaml'}: 1 message type, 1 contract",
        f"wrote {out / 'b.yaml'}: 1 queue, 1 drop",
    ]
    assert (out / "b.yaml").read_text().endswith("drop:\n- kind: route\n  name: old\n")
    assert load_definitions([out], "n").drops == [("route", "old")]


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["CREATE", "DROP"]), st.sampled_from(["a", "b", "c"])), max_size=12))
def test_creates_and_drops_in_any_order_import_as_their_net_effect(ops: list[tuple[str, str]]):
    created: set[str] = set()
    dropped: set[str] = set()
    for op, name in ops:  # the scripts' net effect on a database that may hold a, b and c already
        if op == "CREATE":
            created.add(name)
            dropped.discard(name)
        elif name in created:
            created.discard(name)
        else:
            dropped.add(name)
    result = script("\n".join(f"{op} QUEUE {name}" for op, name in ops))
    assert result.errors == []
    assert {q["name"] for q in result.definitions.get("queues", [])} == created
    assert {d["name"] for d in result.definitions.get("drop", [])} == dropped
    with tempfile.TemporaryDirectory() as tmp:  # never both defined and dropped: the loader takes it
        written = Path(tmp) / "ops.yaml"
        written.write_text(render_yaml(result.definitions, ["s.sql"]), encoding="utf-8")
        loaded = load_definitions([written], "ops")
        assert (set(loaded.queues), {n for _, n in loaded.drops}) == (created, dropped)


NAME_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))  # anything a [bracketed] name holds
NAMES = st.text(NAME_CHARS, min_size=1, max_size=12).filter(lambda n: n not in BUILTIN_MESSAGE_TYPES)
QUEUE_NAMES = st.text(NAME_CHARS, min_size=1, max_size=12)  # any name Service Broker takes
NAMESPACES = st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True)
IDENTIFIER = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
PROCEDURES = st.builds(
    lambda mod, fn: ".".join(mod) + ":" + fn, st.lists(IDENTIFIER, min_size=1, max_size=3), IDENTIFIER
)
ON_OFF = st.sampled_from(["ON", "OFF"])
ADDRESSES = st.one_of(
    st.sampled_from(["LOCAL", "TRANSPORT"]),
    st.builds(lambda host, port, ns: f"kafka://{host}:{port}/{ns}", IDENTIFIER, st.integers(1, 65535), NAMESPACES),
)


@st.composite
def catalogs(draw: st.DrawFn) -> Catalog:
    """A catalog of the subset T-SQL says: what to_tsql writes without a note."""
    collections = {
        # The namespace from the name's code points: any name, an attribute XML can hold.
        n: {"name": n, "schemas": [xsd(f"urn:{n.encode().hex()}:{i}") for i in range(draw(st.integers(1, 3)))]}
        for n in draw(st.lists(QUEUE_NAMES, max_size=2, unique=True))
    }
    message_types: dict[str, dict] = {}
    for n in draw(st.lists(NAMES, max_size=4, unique=True)):
        validation = draw(
            st.sampled_from(["NONE", "EMPTY", "WELL_FORMED_XML", *(["VALID_XML"] if collections else [])])
        )
        message_types[n] = {"name": n, "validation": validation}
        if validation == "VALID_XML":
            message_types[n]["schema_collection"] = draw(st.sampled_from(sorted(collections)))
    contracts = {}
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        types = draw(st.lists(st.sampled_from([DEFAULT, *message_types]), min_size=1, max_size=4, unique=True))
        sides = [draw(st.sampled_from(["INITIATOR", "ANY"]))] + [
            draw(st.sampled_from(["INITIATOR", "TARGET", "ANY"])) for _ in types[1:]
        ]
        contracts[name] = {"name": name, "messages": [{"type": t, "sent_by": s} for t, s in zip(types, sides)]}
    queues: dict[str, dict] = {}
    for name in draw(st.lists(QUEUE_NAMES, max_size=4, unique=True)):
        queues[name] = {"name": name, "status": draw(ON_OFF), "retention": draw(ON_OFF)}
        queues[name]["poison_message_handling"] = draw(ON_OFF)
        if draw(st.booleans()):
            status = draw(ON_OFF)
            procedure = draw(PROCEDURES if status == "ON" else st.none() | PROCEDURES)
            readers = draw(st.integers(0, 32767))
            queues[name]["activation"] = {"status": status, "procedure": procedure, "max_queue_readers": readers}
    services = {}
    if queues:
        for name in draw(st.lists(NAMES, max_size=3, unique=True)):
            accepted = draw(st.lists(st.sampled_from([DEFAULT, *contracts]), max_size=3, unique=True))
            services[name] = {"name": name, "queue": draw(st.sampled_from(sorted(queues))), "contracts": accepted}
            services[name]["owner"] = draw(st.just("dbo") | NAMES)  # AUTHORIZATION, dbo when not written
    routes = {}
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        address = draw(ADDRESSES)
        route = {"name": name, "address": address, "lifetime": draw(st.none() | st.integers(1, 2**31 - 1))}
        if address == "LOCAL":
            route["service_name"] = draw(st.none() | st.sampled_from(sorted(services) or [None]))
        elif address != "TRANSPORT":
            route["service_name"] = draw(st.none() | NAMES)
            route["broker_instance"] = draw(st.none() | NAMESPACES)
            if route["service_name"] and route["broker_instance"] and draw(st.booleans()):
                route["mirror_address"] = draw(ADDRESSES.filter(lambda a: a.startswith("kafka://")))
        try:
            routes[name] = Route.model_validate(route)
        except ValidationError:
            continue  # a combination the catalog refuses (e.g. a route to BrokerConfiguration naming an instance)
    priorities: dict[str, dict] = {}
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        p = {
            "name": name,
            "contract": draw(st.sampled_from(["ANY", DEFAULT, *contracts])),
            "local_service": draw(st.sampled_from(["ANY", *services])),
            "remote_service": draw(st.just("ANY") | NAMES),
            "priority": draw(st.integers(1, 10)),
        }
        if all(
            (p["contract"], p["local_service"], p["remote_service"])
            != (o["contract"], o["local_service"], o["remote_service"])
            for o in priorities.values()
        ):
            priorities[name] = p  # Service Broker refuses two priorities with the same criteria
    bindings: dict[str, dict] = {}
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        far = draw(NAMES)
        if all(b["to_service"] != far for b in bindings.values()):  # one binding a far service
            bindings[name] = {"name": name, "to_service": far, "user": draw(NAMES), "anonymous": draw(st.booleans())}
    honor = draw(st.none() | ON_OFF)
    return Catalog.model_validate(
        {
            "namespace": "rt",
            "remote_service_bindings": bindings,
            "broker_priorities": priorities,
            "database_options": {}
            if honor is None
            else {"honor_broker_priority": {"name": "honor_broker_priority", "value": honor}},
            "message_types": message_types,
            "xml_schema_collections": collections,
            "contracts": contracts,
            "queues": queues,
            "services": services,
            "routes": routes,
        }
    )


@settings(max_examples=150)
@given(catalogs())
def test_a_catalog_written_as_t_sql_imports_back_as_the_same_catalog(catalog: Catalog):
    text, unsaid = to_tsql(catalog)
    assert unsaid == []
    back = import_scripts([("round-trip.sql", text)])
    assert back.errors == [], text
    assert catalog_of(back, "rt").model_dump() == catalog.model_dump()
    with tempfile.TemporaryDirectory() as tmp:  # and the YAML written reads back as kbroker apply reads it
        written = Path(tmp) / "round-trip.yaml"
        written.write_text(render_yaml(back.definitions, ["round-trip.sql"]), encoding="utf-8")
        assert load_definitions([written], "rt").model_dump() == catalog.model_dump()
