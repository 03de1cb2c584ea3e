"""CREATE REMOTE SERVICE BINDING (core/catalog/bindings.py) and a service's owner (CREATE SERVICE
... AUTHORIZATION): the loader's checks, Catalog.binding_for, the catalog records, DROP, and the
T-SQL importer and writer."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kbroker.cli import main
from kbroker.core.catalog.bindings import RemoteServiceBinding, binding_for
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.catalog.drops import dropped, plan_drops
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import Catalog, Service
from kbroker.core.catalog.tsql.to_catalog import Imported, catalog_of, import_scripts, render_yaml
from kbroker.core.catalog.tsql.to_tsql import to_tsql
from kbroker.errors import DefinitionError
from kbroker.errors_catalog import DropNotFoundError
from kbroker.kafka.catalog.catalog_store import records

BASE = """
queues: [{name: Q}]
services:
  - {name: //A/Client, queue: Q, owner: client_user}
  - {name: //A/Other, queue: Q}
"""

BINDINGS = """
remote_service_bindings:
  - {name: ToServer, to_service: //B/Server, user: server_user}
  - {name: ToPublic, to_service: //B/Public, user: public_user, anonymous: true}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> Catalog:
    return load_definitions([write(tmp_path, text)], "ns")


def script(text: str) -> Imported:
    return import_scripts([("s.sql", text)])


def notes(result: Imported) -> list[tuple[int, str]]:
    return [(p.line, p.message) for p in result.notes]


def errors(result: Imported) -> list[tuple[int, str]]:
    return [(p.line, p.message) for p in result.errors]


# --- the catalog ----------------------------------------------------------------------------------


def test_the_loader_reads_bindings_and_service_owners(tmp_path: Path) -> None:
    c = load(tmp_path, BASE + BINDINGS)
    assert c.remote_service_bindings == {
        "ToServer": RemoteServiceBinding(name="ToServer", to_service="//B/Server", user="server_user"),
        "ToPublic": RemoteServiceBinding(name="ToPublic", to_service="//B/Public", user="public_user", anonymous=True),
    }
    assert not c.remote_service_bindings["ToServer"].anonymous  # ANONYMOUS = OFF by default
    assert (c.services["//A/Client"].owner, c.services["//A/Other"].owner) == ("client_user", "dbo")
    assert c.origins["remote service binding ToServer"] == str(tmp_path / "catalog.yaml")


def test_binding_for_finds_the_binding_of_a_far_service_by_its_exact_name(tmp_path: Path) -> None:
    c = load(tmp_path, BASE + BINDINGS)
    assert c.binding_for("//B/Server") == c.remote_service_bindings["ToServer"]
    assert c.binding_for("//B/Public") == c.remote_service_bindings["ToPublic"]
    assert c.binding_for("//b/server") is None  # service names are case-sensitive
    assert c.binding_for("//A/Client") is None
    assert Catalog(namespace="ns").binding_for("//B/Server") is None


def test_two_bindings_applied_apart_the_first_by_name_wins() -> None:
    b, a = (RemoteServiceBinding(name=n, to_service="//B/Server", user=n) for n in ("b", "a"))
    assert binding_for([b, a], "//B/Server") == a == binding_for([a, b], "//B/Server")


def test_two_bindings_of_one_far_service_are_refused_naming_both(tmp_path: Path) -> None:
    text = BINDINGS + "  - {name: AlsoToServer, to_service: //B/Server, user: other_user}\n"
    with pytest.raises(DefinitionError) as info:
        load(tmp_path, text)
    assert info.value.obj == "remote service binding AlsoToServer"
    assert info.value.reason == (
        "binds service '//B/Server', as remote service binding 'ToServer' does: a service has one binding"
    )
    # Another letter case is another service.
    load(tmp_path, BINDINGS + "  - {name: Lower, to_service: //b/server, user: other_user}\n")


def test_two_files_cannot_bind_one_far_service_either(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("remote_service_bindings: [{name: B1, to_service: //far, user: u}]\n")
    (tmp_path / "b.yaml").write_text("remote_service_bindings: [{name: B2, to_service: //far, user: v}]\n")
    with pytest.raises(DefinitionError, match=re.escape("remote service binding B2: binds service '//far'")):
        load_definitions([tmp_path], "ns")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("{name: B, to_service: //far}", "missing required field 'user'"),
        ("{name: B, user: u}", "missing required field 'to_service'"),
        ("{name: B, to_service: //far, user: u, certificate: c}", "unknown field 'certificate'"),
        ("{name: B, to_service: //far, user: ''}", "user"),
        (f"{{name: B, to_service: //far, user: {'u' * 129}}}", "user"),
        (f"{{name: {'b' * 129}, to_service: //far, user: u}}", "name"),
        ("{name: B, to_service: //far, user: u, anonymous: maybe}", "anonymous"),
    ],
)
def test_a_bad_binding_is_refused(tmp_path: Path, entry: str, reason: str) -> None:
    with pytest.raises(DefinitionError, match=reason):
        load(tmp_path, f"remote_service_bindings:\n  - {entry}\n")


@pytest.mark.parametrize("owner", ["''", "u" * 129])
def test_a_bad_owner_is_refused(tmp_path: Path, owner: str) -> None:
    with pytest.raises(DefinitionError, match="service //A/Client: owner"):
        load(tmp_path, f"queues: [{{name: Q}}]\nservices: [{{name: //A/Client, queue: Q, owner: {owner}}}]\n")


def test_bindings_travel_as_catalog_records() -> None:
    b = RemoteServiceBinding(name="ToServer", to_service="//B/Server", user="server_user", anonymous=True)
    assert catalog_record(b"remote_service_binding/ToServer", b.model_dump_json().encode()) == (
        "remote_service_bindings",
        "ToServer",
        b,
    )
    assert catalog_record(b"remote_service_binding/ToServer", None) == ("remote_service_bindings", "ToServer", None)


def test_a_services_owner_is_written_only_when_not_dbo(tmp_path: Path) -> None:
    c = load(tmp_path, BASE + BINDINGS)
    written = {k: orjson.loads(v) for k, v in records(c).items()}
    assert written["service///A/Other"] == {"name": "//A/Other", "queue": "Q", "contracts": [], "remote_senders": None}
    assert written["service///A/Client"]["owner"] == "client_user"
    assert written["remote_service_binding/ToPublic"] == {
        "name": "ToPublic",
        "to_service": "//B/Public",
        "user": "public_user",
        "anonymous": True,
    }
    # A record a kbroker before owners published reads back as the same service: no change to publish.
    old = b'{"name": "//A/Other", "queue": "Q", "contracts": [], "remote_senders": null}'
    found = catalog_record(b"service///A/Other", old)
    assert found is not None and found[2] == c.services["//A/Other"]
    assert Service.model_validate_json(old).owner == "dbo"
    assert Catalog.from_json(c.to_json()).model_dump() == c.model_dump()


def test_a_binding_is_dropped_and_holds_nothing(tmp_path: Path) -> None:
    c = load(tmp_path, BASE + BINDINGS + "  - {name: ToOther, to_service: //A/Other, user: u}\n")
    after = dropped(c, "remote-service-binding", "ToServer")
    assert set(after.remote_service_bindings) == {"ToPublic", "ToOther"}
    with pytest.raises(DropNotFoundError, match="cannot drop remote service binding 'ToServer'"):
        dropped(after, "remote-service-binding", "ToServer")
    # A binding names a far service: a local service of that name drops with the binding left.
    assert "//A/Other" not in dropped(c, "service", "//A/Other").services
    assert plan_drops(c, [("service", "//A/Other"), ("remote-service-binding", "ToOther")]) == [
        ("remote-service-binding", "ToOther"),
        ("service", "//A/Other"),
    ]


def test_a_drop_list_names_bindings(tmp_path: Path) -> None:
    c = load(tmp_path, "drop: [{kind: remote-service-binding, name: Old}]\n")
    assert c.drops == [("remote-service-binding", "Old")]
    with pytest.raises(DefinitionError, match="remote service binding ToServer: is both defined and dropped"):
        load(tmp_path, BINDINGS + "drop: [{kind: remote-service-binding, name: ToServer}]\n")


def test_the_drop_command_offers_bindings() -> None:
    run = CliRunner().invoke(main, ["drop", "--help"])
    assert run.exit_code == 0 and "remote-service-binding" in run.output


# --- T-SQL ----------------------------------------------------------------------------------------

SCRIPT = """CREATE QUEUE q
CREATE SERVICE [//A/Client] AUTHORIZATION client_user ON QUEUE q
CREATE SERVICE [//A/Other] AUTHORIZATION dbo ON QUEUE q
CREATE REMOTE SERVICE BINDING ToServer AUTHORIZATION dbo
    TO SERVICE N'//B/Server'
    WITH USER = server_user;
CREATE REMOTE SERVICE BINDING [To Public] TO SERVICE '//B/Public' WITH USER = [public user], ANONYMOUS = ON
CREATE REMOTE SERVICE BINDING Later TO SERVICE '//B/Later' WITH USER = u, ANONYMOUS = OFF
ALTER REMOTE SERVICE BINDING ToServer WITH ANONYMOUS = ON
ALTER REMOTE SERVICE BINDING [To Public] WITH USER = other_user
ALTER REMOTE SERVICE BINDING Later WITH USER = v, ANONYMOUS = ON
ALTER REMOTE SERVICE BINDING Later WITH ANONYMOUS = OFF
DROP REMOTE SERVICE BINDING Gone
DROP REMOTE SERVICE BINDING IF EXISTS Later
"""


def test_bindings_and_service_owners_import_and_alter_changes_what_it_names(tmp_path: Path) -> None:
    result = script(SCRIPT)
    assert result.errors == []
    assert result.definitions["services"] == [
        {"name": "//A/Client", "queue": "q", "contracts": [], "owner": "client_user"},
        {"name": "//A/Other", "queue": "q", "contracts": []},  # dbo: the default, left out
    ]
    assert result.definitions["remote_service_bindings"] == [
        {"name": "ToServer", "to_service": "//B/Server", "user": "server_user", "anonymous": True},
        {"name": "To Public", "to_service": "//B/Public", "user": "other_user", "anonymous": True},
    ]
    assert result.definitions["drop"] == [{"kind": "remote-service-binding", "name": "Gone"}]
    assert notes(result) == [
        (4, "AUTHORIZATION dbo: only a service has an owner (permissions: kbroker grant)"),
        (
            14,
            "DROP REMOTE SERVICE BINDING Later: drops the remote service binding Later created at s.sql:8: "
            "neither is imported",
        ),
    ]
    statements = [(s["line"], s["statement"], s["maps_to"]) for s in result.statements[3:]]
    assert statements == [
        (4, "CREATE REMOTE SERVICE BINDING", "remote service binding ToServer"),
        (7, "CREATE REMOTE SERVICE BINDING", "remote service binding To Public"),
        (8, "CREATE REMOTE SERVICE BINDING", "remote service binding Later"),
        (9, "ALTER REMOTE SERVICE BINDING", "remote service binding ToServer"),
        (10, "ALTER REMOTE SERVICE BINDING", "remote service binding To Public"),
        (11, "ALTER REMOTE SERVICE BINDING", "remote service binding Later"),
        (12, "ALTER REMOTE SERVICE BINDING", "remote service binding Later"),
        (13, "DROP REMOTE SERVICE BINDING", "drop remote-service-binding Gone"),
        (14, "DROP REMOTE SERVICE BINDING", None),
    ]
    out = tmp_path / "b.yaml"
    out.write_text(render_yaml(result.definitions, ["s.sql"]))
    loaded = load_definitions([out], "b")
    assert loaded.model_dump() == catalog_of(result, "b").model_dump()
    assert loaded.binding_for("//B/Server") == RemoteServiceBinding(
        name="ToServer", to_service="//B/Server", user="server_user", anonymous=True
    )
    assert loaded.services["//A/Client"].owner == "client_user" and loaded.services["//A/Other"].owner == "dbo"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "CREATE REMOTE SERVICE BINDING b TO SERVICE 's'\n WITH ANONYMOUS = ON",
            (1, "remote service binding b: WITH USER = ... is required"),
        ),
        (
            "\nALTER REMOTE SERVICE BINDING b WITH USER = u",
            (2, "ALTER REMOTE SERVICE BINDING b: the remote service binding is not created before it"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING b TO SERVICE 's' WITH USER = u,\n USER = v",
            (2, "USER is given twice"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING b TO SERVICE 's'\n WITH USER = u, CERTIFICATE = c",
            (2, "cannot parse: unexpected 'CERTIFICATE' (expected ANONYMOUS or USER)"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING b TO SERVICE 's' WITH USER = u,\n ANONYMOUS = MAYBE",
            (2, "cannot parse: unexpected 'MAYBE' (expected OFF or ON)"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING b TO SERVICE s WITH USER = u",
            (1, "cannot parse: unexpected 's' (expected STRING)"),
        ),
        (
            "ALTER REMOTE SERVICE BINDING b TO SERVICE 's' WITH USER = u",
            (1, "cannot parse: unexpected 'TO' (expected WITH)"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING a TO SERVICE N'//far' WITH USER = u\n"
            "CREATE REMOTE SERVICE BINDING b TO SERVICE N'//far' WITH USER = v",
            (2, "remote service binding b: binds service '//far', as 'a' does"),
        ),
        (
            "CREATE REMOTE SERVICE BINDING a TO SERVICE 's' WITH USER = u\n"
            "CREATE REMOTE SERVICE BINDING a TO SERVICE 's' WITH USER = v",
            (2, "remote service binding a: created again, differently (first at s.sql:1)"),
        ),
        (
            f"CREATE REMOTE SERVICE BINDING b TO SERVICE 's' WITH USER = [{'u' * 129}]",
            (1, f"remote service binding b: user: String should have at most 128 characters (got {'u' * 129!r})"),
        ),
    ],
)
def test_binding_errors_name_the_statement_line(text: str, expected: tuple[int, str]) -> None:
    found = errors(script(text))
    assert found == [expected]


def test_a_binding_and_an_owner_are_written_as_t_sql_and_read_back() -> None:
    catalog = Catalog.model_validate(
        {
            "namespace": "n",
            "queues": {"q": {"name": "q"}},
            "services": {
                "s": {"name": "s", "queue": "q", "owner": "o]wner"},
                "t": {"name": "t", "queue": "q"},
            },
            "remote_service_bindings": {
                "b": {"name": "b", "to_service": "//it's far", "user": "far user"},
                "p": {"name": "p", "to_service": "//public", "user": "u", "anonymous": True},
            },
        }
    )
    text, unsaid = to_tsql(catalog)
    assert unsaid == []
    assert "CREATE SERVICE [s] AUTHORIZATION [o]]wner] ON QUEUE [q];" in text
    assert "CREATE SERVICE [t] ON QUEUE [q];" in text
    assert (
        "CREATE REMOTE SERVICE BINDING [b] TO SERVICE N'//it''s far'\n    WITH USER = [far user], ANONYMOUS = OFF;"
    ) in text
    assert "CREATE REMOTE SERVICE BINDING [p] TO SERVICE N'//public'\n    WITH USER = [u], ANONYMOUS = ON;" in text
    back = import_scripts([("n.sql", text)])
    assert back.errors == [] and back.notes == []
    assert catalog_of(back, "n").model_dump() == catalog.model_dump()
