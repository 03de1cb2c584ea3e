"""Two queues on one topic, against the real broker. A queue named like another queue's secondary
queue (`EmployeeQueue.web1` beside EmployeeQueue, whose instance web1's replies go to its
secondary queue) gets a topic of its own (its key, core/topic_keys.py). Only a queue kept from
before keys (its topic its name) can still claim another's topic: a new queue there is refused at
apply and an instance at run time, and, for the transport face (names are topics), an endpoint at
install, each with a one-line error."""

from __future__ import annotations

import json

import pytest

from kbroker.cli.demo import CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.catalog.models import Queue
from kbroker.core.transport.endpoint import install_plan, transport_queue_topic
from kbroker.errors import DefinitionError, QueueNameCollisionError
from kbroker.kafka.catalog.apply import apply_paths, sync_topics
from kbroker.kafka.catalog.catalog_store import publish_object, read_catalog
from kbroker.kafka.catalog.topic_specs import TopicSpec, queue_topic_config
from kbroker.kafka.transport.queues import install
from tests.helpers import SAMPLES
from tests.integration.test_catalog_apply import run_cli, topics_of, write


def test_a_queue_named_like_a_secondary_queue_gets_a_topic_of_its_own(kafka_bootstrap, namespace, tmp_path, broker):
    other = write(tmp_path / "other.yaml", "queues: [{name: EmployeeQueue.web1, partitions: 1}]\n")
    apply_paths(kafka_bootstrap, namespace, [SAMPLES, other])
    broker.refresh_catalog()
    assert broker.begin_dialog(EMP, EXP, CONTRACT, instance="web1")  # EmployeeQueue's instance web1
    topics = topics_of(kafka_bootstrap, namespace)
    secondary, queue = (
        names.secondary_queue_topic(namespace, "EmployeeQueue", "web1"),
        names.queue_topic(namespace, "EmployeeQueue.web1"),
    )
    assert {secondary: 1, queue: 1}.items() <= topics.items() and names.kafka_form(secondary) != names.kafka_form(queue)


def kept_queue(bootstrap: str, namespace: str, name: str) -> None:
    """A queue as a kbroker before keys published it: its record without a key, its topic its name."""
    old = Queue(name=name, partitions=1)
    topic = f"kbroker.{namespace}.queue.{name}"
    sync_topics(bootstrap, [TopicSpec(topic, 1, queue_topic_config(old), f"queue {name}", True)])
    publish_object(bootstrap, namespace, "queue", old)


def test_a_later_apply_is_checked_against_the_keys_kept_from_before(kafka_bootstrap, namespace, tmp_path):
    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    for name in ("EmployeeQueue.web1", "EmployeeQueue_web1"):  # once refused: each gets a key of its own now
        apply_paths(kafka_bootstrap, namespace, [write(tmp_path / f"{name}.yaml", f"queues: [{{name: {name}}}]\n")])
    kept_queue(kafka_bootstrap, namespace, "X.web1")  # its topic is X's secondary space
    before = topics_of(kafka_bootstrap, namespace)
    with pytest.raises(DefinitionError) as info:
        apply_paths(kafka_bootstrap, namespace, [write(tmp_path / "x.yaml", "queues: [{name: X}]\n")])
    assert info.value.obj == "queue X"
    assert info.value.reason == (
        "its topic key 'X' collides with queue 'X.web1''s 'X.web1' (applied earlier): "
        "names X.<instance> (or X_...) belong to X's secondary queues"
    )
    assert topics_of(kafka_bootstrap, namespace) == before
    assert set(read_catalog(kafka_bootstrap, namespace).queues) == {
        "ExpenseQueue",
        "EmployeeQueue",
        "EmployeeQueue.web1",
        "EmployeeQueue_web1",
        "X.web1",
    }


def test_an_instance_whose_secondary_queue_is_another_queue_is_refused(kafka_bootstrap, namespace, broker):
    # A catalog applied before apply refused such names: EmployeeQueue.web1 beside EmployeeQueue.
    squatter = Queue(name="EmployeeQueue.web1", partitions=1)
    sync_topics(
        kafka_bootstrap,
        [
            TopicSpec(
                names.queue_topic(namespace, squatter.name),
                1,
                queue_topic_config(squatter),
                "queue EmployeeQueue.web1",
                True,
            )
        ],
    )
    publish_object(kafka_bootstrap, namespace, "queue", squatter)
    broker.refresh_catalog()
    with pytest.raises(QueueNameCollisionError) as info:
        broker.begin_dialog(EMP, EXP, CONTRACT, instance="web1")
    assert str(info.value) == (
        "the secondary queue of EmployeeQueue for instance 'web1' collides with queue "
        "'EmployeeQueue.web1': it would be that queue's topic, or one Kafka refuses "
        "beside it ('.' and '_' are one)"
    )
    assert broker.begin_dialog(EMP, EXP, CONTRACT, instance="web2")  # another instance is free
    assert names.secondary_queue_topic(namespace, "EmployeeQueue", "web2") in topics_of(kafka_bootstrap, namespace)


def test_cli_apply_refuses_with_one_line(kafka_bootstrap, namespace, tmp_path):
    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    kept_queue(kafka_bootstrap, namespace, "Employee_web1")
    before = topics_of(kafka_bootstrap, namespace)
    other = write(tmp_path / "other.yaml", "queues: [{name: Employee}]\n")
    proc = run_cli(kafka_bootstrap, "apply", str(other), "--namespace", namespace)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        f"kbroker: error: {other}: queue Employee: its topic key 'Employee' collides with queue "
        "'Employee_web1''s 'Employee_web1' (applied earlier): names Employee.<instance> (or "
        "Employee_...) belong to Employee's secondary queues"
    ]
    assert topics_of(kafka_bootstrap, namespace) == before


def test_install_refuses_an_endpoint_named_like_another_endpoints_secondary_queue(kafka_bootstrap, namespace):
    install(kafka_bootstrap, namespace, install_plan("Sales", "web1"))
    before = topics_of(kafka_bootstrap, namespace)
    with pytest.raises(QueueNameCollisionError) as info:
        install(kafka_bootstrap, namespace, install_plan("Sales.web1", None))
    assert str(info.value) == (
        "transport queue 'Sales.web1' collides with installed transport queue 'Sales': "
        "names Sales.<instance> (or Sales_...) belong to Sales's secondary queues"
    )
    assert install(kafka_bootstrap, namespace, install_plan("Sales", "web1")) == []  # installing again is fine
    assert install(kafka_bootstrap, namespace, install_plan("Sales", "web2")) == [
        transport_queue_topic(namespace, "Sales.web2")
    ]
    assert topics_of(kafka_bootstrap, namespace) == {**before, transport_queue_topic(namespace, "Sales.web2"): 1}


def test_cli_install_refuses_with_one_line_in_the_other_order(kafka_bootstrap, namespace):
    install(kafka_bootstrap, namespace, install_plan("Billing.web1", None, partitions=1))
    before = topics_of(kafka_bootstrap, namespace)
    proc = run_cli(kafka_bootstrap, "endpoint", "install", "Billing", "--machine", "web1", "--namespace", namespace)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        "kbroker: error: transport queue 'Billing' collides with installed transport queue 'Billing.web1': "
        "names Billing.<instance> (or Billing_...) belong to Billing's secondary queues"
    ]
    assert topics_of(kafka_bootstrap, namespace) == before


def test_cli_install_without_machine_makes_this_hosts_secondary_queue(kafka_bootstrap, namespace):
    """The doc says install makes the machine's secondary queue; without --machine the CLI made
    none, where the SDK's endpoint names this host's (default_machine)."""
    from kbroker.core.transport.endpoint import default_machine

    proc = run_cli(kafka_bootstrap, "endpoint", "install", "Sales", "--namespace", namespace, "--json")
    assert proc.returncode == 0, proc.stderr
    queues = {r["queue"] for r in json.loads(proc.stdout)["queues"]}
    assert queues == {"Sales", f"Sales.{default_machine()}"}
    assert transport_queue_topic(namespace, f"Sales.{default_machine()}") in topics_of(kafka_bootstrap, namespace)
    proc = run_cli(
        kafka_bootstrap, "endpoint", "install", "Sales", "--no-secondary", "--namespace", namespace, "--json"
    )
    assert {r["queue"] for r in json.loads(proc.stdout)["queues"]} == {"Sales"}
