"""The catalog loader and models, without a broker: every invalid definition is refused with the
file, the object and a one-line reason; the sample loads; durations parse exactly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kbroker.core import names
from kbroker.core.catalog.loader import load_definitions, load_system_topics
from kbroker.core.catalog.models import (
    DEFAULT,
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    Catalog,
    Queue,
)
from kbroker.errors import (
    DefinitionError,
    UnknownContractError,
    UnknownMessageTypeError,
    UnknownQueueError,
    UnknownServiceError,
)
from tests.helpers import ROOT

SAMPLE = ROOT / "topics" / "samples" / "expenses.yaml"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"
SUBMISSION = "//Adventure-Works.com/Expenses/ExpenseSubmission"
EXPENSES = "//Adventure-Works.com/Expenses"
EMPLOYEES = "//Adventure-Works.com/Employees"

BASE = """
message_types:
  - name: Ping
contracts:
  - name: PingContract
    messages:
      - {type: Ping, sent_by: INITIATOR}
queues:
  - name: PingQueue
services:
  - name: PingService
    queue: PingQueue
    contracts: [PingContract]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def refused(paths, file: Path | None, obj: str | None, reason: str) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        load_definitions(paths, "ns")
    err = info.value
    assert err.file == (str(file) if file else None), str(err)
    assert err.obj == obj, str(err)
    assert reason in err.reason, str(err)
    assert "\n" not in str(err)
    return err


# --- the sample and the format ----------------------------------------------------------------


def test_sample_loads():
    c = load_definitions([SAMPLE], "expenses")
    assert set(c.services) == {EXPENSES, EMPLOYEES}
    assert c.service(EXPENSES).queue == "ExpenseQueue"
    assert c.service(EMPLOYEES).queue == "EmployeeQueue"
    assert c.service(EXPENSES).contracts == [SUBMISSION] == c.service(EMPLOYEES).contracts
    assert {q.partitions for q in c.queues.values()} == {4}
    act = c.queue("ExpenseQueue").activation
    assert (act.status, act.procedure, act.max_queue_readers) == ("OFF", "kbroker.samples.expenses:process_claims", 2)
    assert c.queue("EmployeeQueue").activation is None
    assert c.message_type(CLAIM).validation == "JSON" == c.message_type(APPROVAL).validation
    assert c.may_send(SUBMISSION, CLAIM, "INITIATOR") and not c.may_send(SUBMISSION, CLAIM, "TARGET")
    assert c.may_send(SUBMISSION, APPROVAL, "TARGET") and not c.may_send(SUBMISSION, APPROVAL, "INITIATOR")
    assert not c.may_send(SUBMISSION, DEFAULT, "INITIATOR")
    assert c.service_accepts(EXPENSES, SUBMISSION) and not c.service_accepts(EXPENSES, DEFAULT)
    assert c.origins["queue ExpenseQueue"] == str(SAMPLE)


def test_topics_directory_loads_system_topics_and_samples():
    c = load_definitions([ROOT / "topics"], "expenses")
    assert set(c.system_topics) == set(names.SYSTEM_TOPICS)
    assert set(c.queues) == {"ExpenseQueue", "EmployeeQueue"}


def test_system_yaml():
    topics = load_system_topics()
    assert set(topics) == set(names.SYSTEM_TOPICS)
    assert (topics["catalog"].partitions, topics["catalog"].config["cleanup.policy"]) == (1, "compact")
    assert (topics["endpoints"].partitions, topics["endpoints"].config["cleanup.policy"]) == (4, "compact")
    for name in ("events", "deadletter"):
        assert topics[name].partitions == 4
        assert topics[name].config == {"cleanup.policy": "delete", "retention.ms": str(7 * 86_400_000)}
    # Messages waiting for transmission are kept however old (G3), as queue topics keep theirs.
    assert topics["transmission"].config == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "segment.bytes": "52428800",
        "segment.ms": "600000",
    }
    assert (ROOT / "topics" / "system.yaml").resolve() == (
        ROOT / "kbroker" / "core" / "catalog" / "system.yaml"
    ).resolve()


def test_builtins_always_present():
    c = load_definitions([SAMPLE], "ns")
    assert c.message_type(DEFAULT).validation == "NONE"
    assert c.message_type(END_DIALOG).validation == "EMPTY"
    assert c.message_type(ERROR).validation == "WELL_FORMED_XML"
    assert c.message_type(DIALOG_TIMER).validation == "EMPTY"
    assert c.may_send(DEFAULT, DEFAULT, "INITIATOR") and c.may_send(DEFAULT, DEFAULT, "TARGET")
    empty = Catalog(namespace="x")
    assert set(empty.message_types) == {DEFAULT, END_DIALOG, ERROR, DIALOG_TIMER}
    assert set(empty.contracts) == {DEFAULT}


def test_lookups_raise_typed_errors():
    c = load_definitions([SAMPLE], "ns")
    with pytest.raises(UnknownServiceError):
        c.service("nope")
    with pytest.raises(UnknownContractError):
        c.contract("nope")
    with pytest.raises(UnknownMessageTypeError):
        c.message_type("nope")
    with pytest.raises(UnknownQueueError):
        c.queue("nope")
    with pytest.raises(UnknownContractError):
        c.may_send("nope", CLAIM, "INITIATOR")
    with pytest.raises(UnknownServiceError):
        c.service_accepts("nope", SUBMISSION)
    with pytest.raises(ValueError):
        c.may_send(SUBMISSION, CLAIM, "ANY")


def test_json_round_trip_keeps_everything_but_loader_extras():
    c = load_definitions([SAMPLE], "ns")
    back = Catalog.from_json(c.to_json())
    assert back.model_dump() == c.model_dump()
    assert back.origins == {} and back.system_topics == {}


def test_yaml_booleans_become_on_off(tmp_path):
    f = write(
        tmp_path,
        "q.yaml",
        """
        queues:
          - name: A
            status: OFF
            retention: ON
            poison_message_handling: off
            activation: {status: no, procedure: "m:f"}
          - name: B
            status: yes
            activation: {status: "on", procedure: "pkg.mod:fn"}
    """,
    )
    c = load_definitions([f], "ns")
    a, b = c.queue("A"), c.queue("B")
    assert (a.status, a.retention, a.poison_message_handling, a.activation.status) == ("OFF", "ON", "OFF", "OFF")
    assert (b.status, b.retention, b.activation.status) == ("ON", "OFF", "ON")


def test_references_across_files_and_to_builtins(tmp_path):
    write(tmp_path, "a/types.yaml", "message_types: [{name: Ping}]\n")
    write(tmp_path, "b/contracts.yml", "contracts: [{name: C, messages: [{type: Ping, sent_by: ANY}]}]\n")
    write(
        tmp_path,
        "c/svc.yaml",
        """
        queues: [{name: Q}]
        services:
          - {name: S, queue: Q, contracts: [C, DEFAULT]}
        routes:
          - {name: R, service_name: S, address: "kafka://h1:9092,h2:9093/sales", lifetime: 60}
          - {name: Everything, address: local}
    """,
    )
    write(tmp_path, "c/notes.txt", "not yaml: [")
    c = load_definitions([tmp_path], "ns")
    assert c.service_accepts("S", "DEFAULT") and c.routes["Everything"].address == "LOCAL"


def test_same_file_twice_is_not_a_duplicate(tmp_path):
    f = write(tmp_path, "base.yaml", BASE)
    assert "PingQueue" in load_definitions([f, tmp_path, f], "ns").queues


def test_empty_file_is_allowed(tmp_path):
    f = write(tmp_path, "empty.yaml", "# nothing yet\n")
    assert load_definitions([f], "ns").queues == {}


# --- every way to be wrong --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, obj, reason",
    [
        ("queues: [{name: Q\n", None, "invalid YAML at line"),
        ("queues:\n  - name: Q\n  bad indent: [\n", None, "invalid YAML"),
        ("- just a list\n", None, "must be a mapping"),
        ("queue: [{name: Q}]\n", None, "unknown top-level key 'queue'"),
        ("queues: {name: Q}\n", None, "queues must be a list"),
        ("queues: [{name: Q, partition: 3}]\n", "queue Q", "unknown field 'partition'"),
        ("queues: [{name: Q, partitions: 0}]\n", "queue Q", "partitions"),
        ("queues: [{name: Q, partitions: 1001}]\n", "queue Q", "partitions"),
        ("queues: [{name: Q, partitions: four}]\n", "queue Q", "partitions"),
        ("queues: [{name: Q, topic_retention: 7d}]\n", "queue Q", "topic_retention is no longer a setting"),
        ("queues: [{name: Q, max_message_bytes: 10485761}]\n", "queue Q", "max_message_bytes"),
        ("queues: [{name: Q, status: maybe}]\n", "queue Q", "status"),
        ("queues: [{name: Q, retention: 1}]\n", "queue Q", "retention"),
        ('queues: [{name: "My\\tQueue"}]\n', "queue My\tQueue", "U+0009"),
        (f"queues: [{{name: {'Q' * 129}}}]\n", f"queue {'Q' * 129}", "1-128 characters"),
        ("queues: [{name: Q, topic_key: Q}]\n", "queue Q", "topic_key is set by 'kbroker apply'"),
        ("queues: [{partitions: 2}]\n", "queue #1", "missing required field 'name'"),
        ("queues: [{name: Q}, {name: Q}]\n", "queue Q", "duplicate name"),
        ("queues: [{name: Q, name: R}]\n", None, "appears twice"),
        ("queues: [{name: Q, activation: {procedure: not-a-function}}]\n", "queue Q", "activation.procedure"),
        ("queues: [{name: Q, activation: {procedure: 'mod:'}}]\n", "queue Q", "module:function"),
        ("queues: [{name: Q, activation: {max_queue_readers: 2}}]\n", "queue Q", "procedure is required"),
        (
            "queues: [{name: Q, activation: {procedure: 'm:f', max_queue_readers: 32768}}]\n",
            "queue Q",
            "activation.max_queue_readers",
        ),
        ("queues: [{name: Q, activation: {procedure: 'm:f', kind: remote}}]\n", "queue Q", "activation.kind"),
        ("message_types: [{name: M, validation: XML}]\n", "message type M", "validation"),
        ("message_types: [{name: DEFAULT}]\n", "message type DEFAULT", "built-in"),
        ("contracts: [{name: DEFAULT, messages: [{type: DEFAULT, sent_by: ANY}]}]\n", "contract DEFAULT", "built-in"),
        ("contracts: [{name: C, messages: []}]\n", "contract C", "messages"),
        ("contracts: [{name: C, messages: [{type: DEFAULT, sent_by: TARGET}]}]\n", "contract C", "INITIATOR or ANY"),
        ("contracts: [{name: C, messages: [{type: DEFAULT, sent_by: BOTH}]}]\n", "contract C", "messages[0].sent_by"),
        (
            "contracts: [{name: C, messages: [{type: Missing, sent_by: ANY}]}]\n",
            "contract C",
            "message type 'Missing' is not defined",
        ),
        ("services: [{name: S, queue: Nowhere}]\n", "service S", "queue 'Nowhere' is not defined"),
        (
            "queues: [{name: Q}]\nservices: [{name: S, queue: Q, contracts: [Nope]}]\n",
            "service S",
            "contract 'Nope' is not defined",
        ),
        ("routes: [{name: R, service_name: Ghost, address: LOCAL}]\n", "route R", "service 'Ghost' is not defined"),
        ("routes: [{name: R, address: 'tcp://h:1'}]\n", "route R", "address"),
        ("routes: [{name: R, address: 'kafka://h:70000'}]\n", "route R", "address"),
        ("routes: [{name: R, address: TRANSPORT, broker_instance: x}]\n", "route R", "TRANSPORT"),
        ("routes: [{name: R, address: LOCAL, lifetime: 0}]\n", "route R", "lifetime"),
        (
            "system_topics: [{name: catalog, partitions: 1, config: {cleanup.policy: delete-all}}]\n",
            "system topic catalog",
            "cleanup.policy",
        ),
        (
            "system_topics: [{name: stuff, partitions: 1, config: {cleanup.policy: delete}}]\n",
            "system topic stuff",
            "name",
        ),
    ],
)
def test_invalid_definitions(tmp_path, text, obj, reason):
    f = write(tmp_path, "bad.yaml", text)
    refused([f], f, obj, reason)


def test_error_message_names_file_object_and_reason(tmp_path):
    f = write(tmp_path, "bad.yaml", "contracts: [{name: C, messages: [{type: Missing, sent_by: ANY}]}]\n")
    err = refused([f], f, "contract C", "Missing")
    assert str(err) == f"{f}: contract C: message type 'Missing' is not defined"


def test_duplicate_across_files_names_the_second_file(tmp_path):
    first = write(tmp_path, "1.yaml", BASE)
    second = write(tmp_path, "2.yaml", "queues: [{name: PingQueue, partitions: 8}]\n")
    err = refused([tmp_path], second, "queue PingQueue", "duplicate name")
    assert str(first) in err.reason


def test_reference_error_names_the_referring_file(tmp_path):
    write(tmp_path, "1.yaml", BASE)
    bad = write(tmp_path, "2.yaml", "services: [{name: Other, queue: PingQueue, contracts: [Nope]}]\n")
    refused([tmp_path], bad, "service Other", "contract 'Nope'")


def test_error_in_one_file_of_many_fails_the_load(tmp_path):
    write(tmp_path, "a.yaml", BASE)
    bad = write(tmp_path, "z/b.yaml", "contracts: [{name: C2, messages: [{type: Nope, sent_by: ANY}]}]\n")
    refused([tmp_path], bad, "contract C2", "message type 'Nope'")


def test_missing_path_and_empty_directory(tmp_path):
    refused([tmp_path / "nope.yaml"], tmp_path / "nope.yaml", None, "no such file")
    (tmp_path / "empty").mkdir()
    refused([tmp_path / "empty"], tmp_path / "empty", None, "no *.yaml")
    refused([], None, None, "no definition files")


def test_bad_namespace(tmp_path):
    with pytest.raises(DefinitionError, match="namespace"):
        load_definitions([SAMPLE], "bad namespace!")


# --- names ------------------------------------------------------------------------------------


def test_names():
    assert names.queue_topic("ns", "Q-1") == "kbroker.ns.queue.Q-1" == names.queue_group("ns", "Q-1")
    assert names.queue_topic("ns", "Q.1") == "kbroker.ns.queue._Q-2e-1"  # its key (core/topic_keys.py)
    assert names.catalog_topic("ns") == "kbroker.ns.catalog"
    assert names.endpoints_topic("ns") == "kbroker.ns.endpoints"
    assert names.events_topic("ns") == "kbroker.ns.events"
    assert names.deadletter_topic("ns") == "kbroker.ns.deadletter"
    assert names.transmission_topic("ns") == "kbroker.ns.transmission"
    assert names.queue_of_topic("ns", "kbroker.ns.queue._Q-2e-1") == "Q.1"
    assert names.queue_of_topic("ns", "kbroker.ns.queue.Q-1.web1") == "Q-1.web1"  # a secondary queue's
    assert names.queue_of_topic("ns", "kbroker.other.queue.Q") is None
    with pytest.raises(ValueError):
        names.queue_topic("bad.ns", "Q")
    with pytest.raises(ValueError, match="U"):
        names.queue_topic("ns", "bad\x00queue")


# --- catalog records of older versions --------------------------------------------------------


def test_a_published_queue_with_the_old_topic_retention_still_reads_back():
    """A queue record an older kbroker published carries `topic_retention`: read back from the
    catalog topic it validates, without the setting (queue topics keep every record now)."""
    q = Queue.model_validate({"name": "Q", "partitions": 2, "topic_retention": "7d"})
    assert q.partitions == 2 and "topic_retention" not in q.model_dump()
