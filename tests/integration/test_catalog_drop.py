"""`kbroker drop` against a real Kafka broker: each kind dropped from the catalog topic, each
refusal before anything changes, a queue's topics kept unless --delete-topics, a contract's
messages fixed on apply, and DROP SERVICE ending its open dialogs with Error -8470 at the far
side and CLOSED endpoints here; the command's one-line error and --json."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from kbroker.core import names
from kbroker.core.catalog.models import ERROR
from kbroker.core.dialogs.conversation_endpoint import CLOSED
from kbroker.errors_catalog import ContractFixedError, DropNotFoundError, DropRefusedError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.sdk.broker import Broker
from kbroker.sdk.catalog_drop import drop
from tests.integration.test_catalog_apply import run_cli, write

EMP, EXP = "//Adventure-Works.com/Employees", "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"

DEFS = """
xml_schema_collections:
  - name: X
    schemas: ['<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema"><xsd:element name="a"/></xsd:schema>']
message_types:
  - {name: M, validation: VALID_XML, schema_collection: X}
contracts:
  - {name: C, messages: [{type: M, sent_by: INITIATOR}]}
queues:
  - {name: Q}
services:
  - {name: S, queue: Q, contracts: [C]}
routes:
  - {name: R, service_name: S, address: LOCAL}
"""


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


@pytest.fixture
def applied(kafka_bootstrap, namespace, tmp_path):
    apply_paths(kafka_bootstrap, namespace, [write(tmp_path / "defs.yaml", DEFS)])
    return namespace


def test_each_refusal_changes_nothing_then_each_kind_drops_in_order(kafka_bootstrap, applied):
    ns = applied
    for kind, name, user in [
        ("xml-schema-collection", "X", "message type M"),
        ("message-type", "M", "contract C"),
        ("contract", "C", "service S"),
        ("queue", "Q", "service S"),
        ("service", "S", "route R"),
    ]:
        with pytest.raises(DropRefusedError) as info:
            drop(kafka_bootstrap, ns, kind, name)
        assert info.value.users == (user,)
    with pytest.raises(DropRefusedError, match="built-in"):
        drop(kafka_bootstrap, ns, "contract", "DEFAULT")
    with pytest.raises(DropNotFoundError):
        drop(kafka_bootstrap, ns, "route", "Nope")
    c = read_catalog(kafka_bootstrap, ns)
    assert {"R"} == set(c.routes) and "S" in c.services and "X" in c.xml_schema_collections
    queue_topic = names.queue_topic(ns, "Q")
    for kind, name in [
        ("route", "R"),
        ("service", "S"),
        ("queue", "Q"),
        ("contract", "C"),
        ("message-type", "M"),
        ("xml-schema-collection", "X"),
    ]:
        report = drop(kafka_bootstrap, ns, kind, name)
        assert report.kind == kind and report.name == name
        if kind == "queue":
            assert report.topics_kept == [queue_topic] and report.topics_deleted == []
    c = read_catalog(kafka_bootstrap, ns)
    assert not (c.routes or c.services or c.queues or c.xml_schema_collections)
    assert "C" not in c.contracts and "M" not in c.message_types
    assert queue_topic in topics(kafka_bootstrap)  # kept by default


def test_delete_topics_deletes_the_queue_topic(kafka_bootstrap, namespace, tmp_path):
    apply_paths(kafka_bootstrap, namespace, [write(tmp_path / "q.yaml", "queues: [{name: Q}, {name: Q2}]\n")])
    report = drop(kafka_bootstrap, namespace, "queue", "Q", delete_topics=True)
    assert report.topics_deleted == [names.queue_topic(namespace, "Q")]
    assert names.queue_topic(namespace, "Q2") in topics(kafka_bootstrap)
    assert set(read_catalog(kafka_bootstrap, namespace).queues) == {"Q2"}


def test_a_dropped_object_can_be_created_again(kafka_bootstrap, applied, tmp_path):
    for kind, name in [("route", "R"), ("service", "S")]:
        drop(kafka_bootstrap, applied, kind, name)
    apply_paths(kafka_bootstrap, applied, [tmp_path / "defs.yaml"])
    assert "S" in read_catalog(kafka_bootstrap, applied).services


def test_apply_refuses_to_change_a_contracts_messages(kafka_bootstrap, applied, tmp_path):
    changed = DEFS.replace("{type: M, sent_by: INITIATOR}", "{type: M, sent_by: ANY}")
    with pytest.raises(ContractFixedError, match="contract C: a contract's messages are fixed"):
        apply_paths(kafka_bootstrap, applied, [write(tmp_path / "changed" / "defs.yaml", changed)])
    assert read_catalog(kafka_bootstrap, applied).contract("C").messages[0].sent_by == "INITIATOR"
    for kind, name in [("route", "R"), ("service", "S"), ("contract", "C")]:
        drop(kafka_bootstrap, applied, kind, name)
    apply_paths(kafka_bootstrap, applied, [tmp_path / "changed" / "defs.yaml"])  # dropped, then created again
    assert read_catalog(kafka_bootstrap, applied).contract("C").messages[0].sent_by == "ANY"


@pytest.mark.parametrize("dropped", [EXP, EMP])
def test_drop_service_errors_the_far_side_and_closes_its_endpoints(kafka_bootstrap, namespace, broker, dropped):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 0})
    [m] = broker.receive("ExpenseQueue", top=1, wait=15)
    th = m.conversation_handle
    untouched = broker.begin_dialog(EMP, EXP, CONTRACT)  # never sent: closed silently on DROP of EMP
    report = drop(kafka_bootstrap, namespace, "service", dropped)
    mine, far, far_queue = (th, h, "EmployeeQueue") if dropped == EXP else (h, th, "ExpenseQueue")
    assert mine in report.dialogs_ended
    [err] = broker.receive(far_queue, top=10, wait=15)
    assert err.message_type_name == ERROR and err.conversation_handle == far
    assert b"<Code>-8470</Code>" in err.body and b"Remote service has been dropped." in err.body
    with Broker(kafka_bootstrap, namespace) as fresh:
        assert fresh.endpoints.get(mine).state == CLOSED
        if dropped == EMP:
            assert fresh.endpoints.get(untouched).state == CLOSED
        assert dropped not in fresh.refresh_catalog().services
    broker.refresh_catalog()  # the far side knows the service is gone: no EndDialog goes back to it
    broker.end_conversation(far)  # the far side ends as after any Error
    assert broker.endpoints.get(far).state == CLOSED


def test_cli_drop_one_line_error_and_json(kafka_bootstrap, applied):
    refused = run_cli(kafka_bootstrap, "drop", "contract", "C", "--namespace", applied)
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0
    assert "cannot drop contract 'C': it is used by service S" in refused.stderr
    done = run_cli(kafka_bootstrap, "drop", "route", "R", "--namespace", applied, "--json")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {
        "namespace": applied,
        "kind": "route",
        "name": "R",
        "dialogs_ended": [],
        "topics_deleted": [],
        "topics_kept": [],
    }
    plain = run_cli(kafka_bootstrap, "drop", "service", "S", "--namespace", applied)
    assert plain.returncode == 0, plain.stderr
    assert f"namespace {applied}: dropped service S" in plain.stdout


def test_apply_drop_list_runs_after_the_definitions_and_again_is_a_no_op(kafka_bootstrap, applied, tmp_path):
    drops = write(
        tmp_path / "drops" / "drops.yaml",
        "queues: [{name: Q2}]\n"
        "drop:\n  - {kind: queue, name: Q}\n  - {kind: service, name: S}\n  - {kind: route, name: R}\n",
    )
    report = apply_paths(kafka_bootstrap, applied, [drops])
    assert report.dropped == ["route R", "service S", "queue Q"]
    c = read_catalog(kafka_bootstrap, applied)
    assert set(c.queues) == {"Q2"} and not c.services and not c.routes and "C" in c.contracts
    assert apply_paths(kafka_bootstrap, applied, [drops]).dropped == []  # IF EXISTS


def test_apply_drop_list_refused_changes_nothing(kafka_bootstrap, applied, tmp_path):
    bad = write(tmp_path / "bad" / "bad.yaml", "queues: [{name: Q3}]\ndrop: [{kind: queue, name: Q}]\n")
    with pytest.raises(DropRefusedError, match="cannot drop queue 'Q': it is used by service S"):
        apply_paths(kafka_bootstrap, applied, [bad])
    assert "Q3" not in read_catalog(kafka_bootstrap, applied).queues
    assert names.queue_topic(applied, "Q3") not in topics(kafka_bootstrap)


def test_cli_apply_drop_list_ends_a_dropped_services_dialogs(kafka_bootstrap, namespace, broker, tmp_path):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 0})
    [m] = broker.receive("ExpenseQueue", top=1, wait=15)
    drops = write(tmp_path / "drops.yaml", f"drop: [{{kind: service, name: '{EXP}'}}]\n")
    done = run_cli(kafka_bootstrap, "apply", str(drops), "--namespace", namespace, "--json")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["dropped"] == [f"service {EXP}"]
    [err] = broker.receive("EmployeeQueue", top=10, wait=15)
    assert err.conversation_handle == h and b"<Code>-8470</Code>" in err.body
    with Broker(kafka_bootstrap, namespace) as fresh:
        assert fresh.endpoints.get(m.conversation_handle).state == CLOSED
