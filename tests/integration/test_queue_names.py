"""Two queues on one topic (issue 22, case 4), against the real broker: a queue named like another
queue's secondary queue (`EmployeeQueue.web1` beside EmployeeQueue, whose instance web1 replies
go to topic `...queue.EmployeeQueue.web1`) is refused at apply, at a later apply, when an instance
names its secondary queue, and for the transport face at install, with a one-line error."""

from __future__ import annotations

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

SECONDARY_SPACE = "names EmployeeQueue.<instance> (or EmployeeQueue_...) belong to EmployeeQueue's secondary queues"


def test_apply_refuses_a_queue_named_like_a_secondary_queue_and_changes_nothing(kafka_bootstrap, namespace, tmp_path):
    other = write(tmp_path / "other.yaml", "queues: [{name: EmployeeQueue.web1, partitions: 1}]\n")
    with pytest.raises(DefinitionError) as info:
        apply_paths(kafka_bootstrap, namespace, [SAMPLES, other])
    assert (info.value.file, info.value.obj) == (str(other), "queue EmployeeQueue.web1")
    assert info.value.reason == f"collides with queue 'EmployeeQueue': {SECONDARY_SPACE}"
    assert topics_of(kafka_bootstrap, namespace) == {}


def test_a_later_apply_is_checked_against_the_queues_applied_earlier(kafka_bootstrap, namespace, tmp_path):
    apply_paths(kafka_bootstrap, namespace, [SAMPLES])
    before = topics_of(kafka_bootstrap, namespace)
    for name in ("EmployeeQueue.web1", "EmployeeQueue_web1"):  # the same topic; one Kafka refuses beside it
        f = write(tmp_path / f"{name}.yaml", f"queues: [{{name: {name}, partitions: 1}}]\n")
        with pytest.raises(DefinitionError) as info:
            apply_paths(kafka_bootstrap, namespace, [f])
        assert info.value.reason == f"collides with queue 'EmployeeQueue' (applied earlier): {SECONDARY_SPACE}"
    # The other order: the queue first, then the queue whose secondary queues it would be.
    write(tmp_path / "x1.yaml", "queues: [{name: X.web1}]\n")
    apply_paths(kafka_bootstrap, namespace, [tmp_path / "x1.yaml"])
    with pytest.raises(DefinitionError, match="queue X: collides with queue 'X.web1' .applied earlier."):
        apply_paths(kafka_bootstrap, namespace, [write(tmp_path / "x2.yaml", "queues: [{name: X}]\n")])
    assert topics_of(kafka_bootstrap, namespace) == {**before, names.queue_topic(namespace, "X.web1"): 4}
    assert set(read_catalog(kafka_bootstrap, namespace).queues) == {"ExpenseQueue", "EmployeeQueue", "X.web1"}


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
    other = write(tmp_path / "other.yaml", "queues: [{name: EmployeeQueue.web1}]\n")
    proc = run_cli(kafka_bootstrap, "apply", str(SAMPLES), str(other), "--namespace", namespace)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        f"kbroker: error: {other}: queue EmployeeQueue.web1: collides with queue 'EmployeeQueue': {SECONDARY_SPACE}"
    ]
    assert topics_of(kafka_bootstrap, namespace) == {}


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
