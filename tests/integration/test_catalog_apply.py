"""`kbroker apply` against a real Kafka broker: topics created once, catalog published and read
back, and an invalid definition set changes nothing at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from kbroker.core import names
from kbroker.errors import DefinitionError
from kbroker.kafka.catalog.apply import HEADER_HEADROOM, apply_paths, ensure_system_topics
from kbroker.kafka.catalog.catalog_store import read_catalog
from tests.helpers import SAMPLES

KBROKER = Path(sys.executable).with_name("kbroker")
SUBMISSION = "//Adventure-Works.com/Expenses/ExpenseSubmission"
EXPENSES = "//Adventure-Works.com/Expenses"
EMPLOYEES = "//Adventure-Works.com/Employees"
SYSTEM = {
    "catalog": (1, "compact"),
    "endpoints": (4, "compact"),
    "events": (4, "delete"),
    "deadletter": (4, "delete"),
    "transmission": (4, "delete"),
    "timers": (4, "compact"),
    "readers": (1, "compact,delete"),
    "progress": (1, "delete"),
    "analytics": (1, "compact,delete"),
    "control": (1, "delete"),
    "inbound": (4, "delete"),
    "acks": (4, "compact"),
    "transport": (1, "compact,delete"),
    "holds": (1, "delete"),
}


def topics_of(bootstrap: str, namespace: str) -> dict[str, int]:
    """name -> partition count of every topic of the namespace."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {t: len(m.partitions) for t, m in md.topics.items() if t.startswith(names.prefix(namespace))}


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {k: e.value for k, e in future.result().items()}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_apply_samples_creates_queue_and_system_topics(kafka_bootstrap, namespace):
    report = apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    expected = {names.system_topic(namespace, n): p for n, (p, _) in SYSTEM.items()}
    expected |= {names.queue_topic(namespace, "ExpenseQueue"): 4, names.queue_topic(namespace, "EmployeeQueue"): 4}
    assert sorted(report.topics_created) == sorted(expected)
    assert report.objects_published == 7  # 2 message types, 1 contract, 2 queues, 2 services
    assert topics_of(kafka_bootstrap, namespace) == expected
    for name, (_, policy) in SYSTEM.items():
        assert topic_config(kafka_bootstrap, names.system_topic(namespace, name))["cleanup.policy"] == policy
    queue_cfg = topic_config(kafka_bootstrap, names.queue_topic(namespace, "ExpenseQueue"))
    assert queue_cfg["cleanup.policy"] == "delete"
    assert (queue_cfg["retention.ms"], queue_cfg["retention.bytes"]) == ("-1", "-1")  # reclaimed, not expired
    assert queue_cfg["max.message.bytes"] == str(1_048_576 + HEADER_HEADROOM)


def test_apply_twice_changes_nothing_the_second_time(kafka_bootstrap, namespace):
    first = apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    second = apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    assert first.topics_created
    assert (second.topics_created, second.topics_updated, second.objects_published) == ([], [], 0)
    assert ensure_system_topics(kafka_bootstrap, namespace).topics_created == []


def test_read_catalog_returns_what_was_applied(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    c = read_catalog(kafka_bootstrap, namespace)
    assert set(c.services) == {EXPENSES, EMPLOYEES}
    assert c.service(EXPENSES).queue == "ExpenseQueue" and c.service(EMPLOYEES).queue == "EmployeeQueue"
    assert c.service_accepts(EXPENSES, SUBMISSION) and c.service_accepts(EMPLOYEES, SUBMISSION)
    assert SUBMISSION in c.contracts and "DEFAULT" in c.contracts
    assert c.queue("ExpenseQueue").activation.max_queue_readers == 2
    assert c.may_send(SUBMISSION, "//Adventure-Works.com/Expenses/ExpenseClaim", "INITIATOR")


def test_read_catalog_without_topic_has_only_builtins(kafka_bootstrap, namespace):
    c = read_catalog(kafka_bootstrap, namespace)
    assert (c.services, c.queues) == ({}, {})
    assert set(c.contracts) == {"DEFAULT"} and "DEFAULT" in c.message_types
    assert topics_of(kafka_bootstrap, namespace) == {}  # reading created nothing


def test_invalid_file_set_applies_nothing(kafka_bootstrap, namespace, tmp_path):
    write(tmp_path / "good.yaml", (SAMPLES / "expenses.yaml").read_text())
    bad = write(
        tmp_path / "more" / "bad.yaml", "contracts: [{name: C, messages: [{type: Missing, sent_by: INITIATOR}]}]\n"
    )
    with pytest.raises(DefinitionError) as info:
        apply_paths(kafka_bootstrap, namespace, [tmp_path])
    assert (info.value.file, info.value.obj) == (str(bad), "contract C")
    assert topics_of(kafka_bootstrap, namespace) == {}
    assert read_catalog(kafka_bootstrap, namespace).services == {}


def test_partitions_grow_configs_update_and_never_shrink(kafka_bootstrap, namespace, tmp_path):
    f = write(tmp_path / "q.yaml", "queues: [{name: Q, partitions: 2}]\n")
    topic = names.queue_topic(namespace, "Q")
    apply_paths(kafka_bootstrap, namespace, [f])
    write(f, "queues: [{name: Q, partitions: 3, max_message_bytes: 2000000}]\n")
    report = apply_paths(kafka_bootstrap, namespace, [f])
    assert (report.topics_created, report.topics_updated, report.objects_published) == ([], [topic], 1)
    assert topics_of(kafka_bootstrap, namespace)[topic] == 3
    cfg = topic_config(kafka_bootstrap, topic)
    assert cfg["max.message.bytes"] == str(2_000_000 + HEADER_HEADROOM)

    write(f, "queues: [{name: Q, partitions: 1}]\n")
    with pytest.raises(DefinitionError) as info:
        apply_paths(kafka_bootstrap, namespace, [f])
    assert (info.value.file, info.value.obj) == (str(f), "queue Q") and "shrink" in info.value.reason
    # refused before anything changed: the size limit stays, the catalog keeps 3 partitions
    assert topic_config(kafka_bootstrap, topic)["max.message.bytes"] == str(2_000_000 + HEADER_HEADROOM)
    assert read_catalog(kafka_bootstrap, namespace).queue("Q").partitions == 3


def run_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBROKER_BOOTSTRAP": bootstrap}
    env.pop("KBROKER_NAMESPACE", None)
    return subprocess.run([str(KBROKER), *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_apply_bad_file_exits_1_with_one_line(kafka_bootstrap, namespace, tmp_path):
    bad = write(tmp_path / "bad.yaml", "contracts: [{name: C, messages: [{type: Missing, sent_by: ANY}]}]\n")
    proc = run_cli(kafka_bootstrap, "apply", str(SAMPLES), str(bad), "--namespace", namespace)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"kbroker: error: {bad}: contract C: message type 'Missing' is not defined"]
    assert topics_of(kafka_bootstrap, namespace) == {}


def test_cli_apply_json_and_catalog_show(kafka_bootstrap, namespace):
    proc = run_cli(kafka_bootstrap, "apply", str(SAMPLES), "--namespace", namespace, "--json")
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert len(report["topics_created"]) == len(SYSTEM) + 2 and report["objects_published"] == 7

    again = orjson.loads(run_cli(kafka_bootstrap, "apply", str(SAMPLES), "--namespace", namespace, "--json").stdout)
    assert (again["topics_created"], again["objects_published"]) == ([], 0)

    shown = run_cli(kafka_bootstrap, "catalog", "show", "--namespace", namespace, "--json")
    assert shown.returncode == 0, shown.stderr
    catalog = orjson.loads(shown.stdout)
    assert set(catalog["services"]) == {EXPENSES, EMPLOYEES}
    assert set(catalog["queues"]) == {"ExpenseQueue", "EmployeeQueue"}

    text = run_cli(kafka_bootstrap, "catalog", "show", "--namespace", namespace)
    assert text.returncode == 0 and "ExpenseQueue" in text.stdout
