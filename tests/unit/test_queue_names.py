"""Queue names that cannot collide in Kafka (issue 22, case 4), without a broker: a queue claims
the names of its secondary queues, names Kafka compares as equal ('.' and '_') are refused, and,
for any names the rule accepts, no two queues or secondary queues ever map to one topic or to
topics Kafka refuses side by side."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.catalog.loader import check_queue_names, load_definitions
from kbroker.core.transport.endpoint import (
    install_collision,
    install_plan,
    transport_queue_prefix,
    transport_queue_topic,
)
from kbroker.errors import DefinitionError

NS = "sales"
# Few letters and many separators, so generated names collide often.
queue_names = st.text(alphabet="ab._-", min_size=1, max_size=6)
instance_names = st.text(alphabet="ab_-", min_size=1, max_size=3)


@pytest.mark.parametrize(
    ("a", "b"), [("X", "X.web1"), ("X", "X_web1"), ("X", "X.a.b"), ("a.b", "a_b"), ("X.web1", "X"), ("Q_", "Q")]
)
def test_colliding_queue_names(a, b):
    assert names.queue_names_collide(a, b) is not None


@pytest.mark.parametrize(
    ("a", "b"),
    [("X", "X"), ("X", "XY"), ("X", "X-web1"), ("Orders", "OrdersArchive"), ("X.a", "X.b"), ("X.web1", "Y.web1")],
)
def test_queue_names_that_do_not_collide(a, b):
    assert names.queue_names_collide(a, b) is None


def accepted(queues: list[str]) -> list[str]:
    """The queues an apply of `queues` in this order keeps: each one that collides with none before it."""
    kept: list[str] = []
    for q in queues:
        if all(names.queue_names_collide(q, k) is None for k in kept):
            kept.append(q)
    return kept


def assert_one_owner_per_kafka_name(owned: dict[str, object]) -> None:
    """`owned`: topic -> who uses it. No two owners on one topic is given by the dict; no two
    topics Kafka would refuse side by side is checked here."""
    forms: dict[str, str] = {}
    for topic in owned:
        other = forms.setdefault(names.kafka_form(topic), topic)
        assert other == topic, f"{topic} ({owned[topic]}) collides in Kafka with {other} ({owned[other]})"


@settings(max_examples=300)
@given(st.lists(queue_names, max_size=8), st.lists(instance_names, max_size=4))
@example(["X.web1", "X"], ["web1"])
def test_accepted_queue_names_never_share_or_collide_with_a_topic(queues, instances):
    owned: dict[str, object] = {}
    for q in accepted(queues):
        topics = [(names.queue_topic(NS, q), ("queue", q))]
        topics += [(names.secondary_queue_topic(NS, q, i), ("secondary", q, i)) for i in instances]
        for topic, owner in topics:
            assert owned.setdefault(topic, owner) == owner, f"{owner} and {owned[topic]} share {topic}"
    assert_one_owner_per_kafka_name(owned)
    for q in accepted(queues):
        for i in instances:
            assert names.secondary_queue_collision(accepted(queues), q, i) is None


@given(st.lists(queue_names, min_size=1, max_size=8), st.data())
def test_an_instance_the_runtime_check_accepts_meets_no_other_queue(queues, data):
    # Any catalog, even one applied before apply refused collisions.
    queue, instance = data.draw(st.sampled_from(queues)), data.draw(instance_names)
    if names.secondary_queue_collision(queues, queue, instance) is None:
        secondary = names.kafka_form(names.secondary_queue_topic(NS, queue, instance))
        assert all(names.kafka_form(names.queue_topic(NS, p)) != secondary for p in queues)


def test_the_issue_pair_is_refused_at_run_time():
    assert names.secondary_queue_collision(["EmployeeQueue", "EmployeeQueue.web1"], "EmployeeQueue", "web1") == (
        "EmployeeQueue.web1",
        "it would be that queue's topic, or one Kafka refuses beside it ('.' and '_' are one)",
    )
    assert names.secondary_queue_collision(["X", "X_web1"], "X", "web1")[0] == "X_web1"
    assert names.secondary_queue_collision(["X", "X.a"], "X", "a_b") == (  # X.a's instance b is X_a_b too
        "X.a",
        "names X.a.<instance> belong to X.a's secondary queues",
    )
    assert names.secondary_queue_collision(["X", "Y.web1"], "X", "web1") is None


def test_loader_refuses_a_queue_in_another_queues_secondary_space(tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text("queues: [{name: EmployeeQueue}, {name: EmployeeQueue.web1}]\n")
    with pytest.raises(DefinitionError) as info:
        load_definitions([f], NS)
    assert str(info.value) == (
        f"{f}: queue EmployeeQueue.web1: collides with queue 'EmployeeQueue': names "
        "EmployeeQueue.<instance> (or EmployeeQueue_...) belong to EmployeeQueue's secondary queues"
    )


def test_check_holds_against_queues_applied_earlier():
    with pytest.raises(DefinitionError) as info:
        check_queue_names(["X"], {"queue X": "b.yaml"}, applied=["X.web1", "Y"])
    assert (info.value.file, info.value.obj) == ("b.yaml", "queue X")
    assert "collides with queue 'X.web1' (applied earlier)" in info.value.reason
    with pytest.raises(DefinitionError, match="'a.b' .applied earlier.: Kafka treats"):
        check_queue_names(["a_b"], {}, applied=["a.b"])
    check_queue_names(["X", "Y"], {}, applied=["X", "Z"])  # applying X again is no collision
    check_queue_names(["Z"], {}, applied=["X", "X.web1"])  # an old collision is not this apply's


@pytest.mark.parametrize(
    ("installed", "endpoint", "machine", "refused"),
    [
        ({"Sales.web1"}, "Sales", "web1", ("Sales", "Sales.web1")),  # an endpoint Sales.web1 came first
        ({"Sales", "Sales.web1"}, "Sales.web1", "m2", ("Sales.web1", "Sales")),  # Sales's secondary came first
        ({"Sales"}, "Sales_x", None, ("Sales_x", "Sales")),
        ({"Sales_web1"}, "Sales", None, ("Sales", "Sales_web1")),
        ({"a.b"}, "a_b", "m", ("a_b", "a.b")),
        ({"Sales", "Sales_web1"}, "Sales", "web1", ("Sales.web1", "Sales_web1")),  # from before the check
    ],
)
def test_install_refuses_a_colliding_transport_queue(installed, endpoint, machine, refused):
    collision = install_collision(install_plan(endpoint, machine), installed)
    assert collision is not None and collision[:2] == refused


@pytest.mark.parametrize(
    ("installed", "endpoint", "machine"),
    [
        (set(), "Sales", "web1"),
        ({"Sales", "Sales.web1"}, "Sales", "web1"),  # installing again
        ({"Sales", "Sales.web1"}, "Sales", "web2"),  # another instance
        ({"Sales", "Sales.web1"}, "Billing", "web1"),
        ({"Sales"}, "SalesArchive", "web1"),
    ],
)
def test_install_accepts_free_names(installed, endpoint, machine):
    assert install_collision(install_plan(endpoint, machine), installed) is None


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.text(alphabet="a._", min_size=1, max_size=4),
            st.one_of(st.none(), st.text(alphabet="a_", min_size=1, max_size=2)),
        ),
        max_size=8,
    )
)
@example([("a.a", None), ("a", "a")])  # the issue's order: the endpoint named like a secondary queue first
def test_installs_the_check_accepts_never_share_or_collide_with_a_topic(installs):
    owned: dict[str, object] = {}  # topic -> (endpoint, role)
    for endpoint, machine in installs:
        plan = install_plan(endpoint, machine)
        if install_collision(plan, _queues(owned)) is not None:
            continue
        roles = [("primary", endpoint)] + [("secondary", endpoint)] * (len(plan.queues) - 1)
        for (queue, _p), (role, owner) in zip(plan.queues, roles):
            topic = transport_queue_topic(NS, queue)
            assert owned.setdefault(topic, (owner, role, queue)) == (owner, role, queue), (
                f"{(owner, role, queue)} and {owned[topic]} share {topic}"
            )
    assert_one_owner_per_kafka_name(owned)


def _queues(owned: dict[str, object]) -> set[str]:
    prefix = transport_queue_prefix(NS)
    return {t[len(prefix) :] for t in owned}


def test_a_satellite_installs_among_its_endpoints_names_but_not_on_a_kafka_collision():
    assert install_collision(install_plan("Sales.Retries", None, satellite=True), {"Sales", "Sales.web1"}) is None
    assert install_collision(install_plan("Sales.Retries", None), {"Sales"})[:2] == ("Sales.Retries", "Sales")
    assert install_collision(install_plan("Sales.Retries", None, satellite=True), {"Sales_Retries"})[:2] == (
        "Sales.Retries",
        "Sales_Retries",
    )
