"""Queue names and the topics they get, without a broker: any name Service Broker takes gets a
key of its own (core/topic_keys.py), so no two queues or secondary queues ever map to one topic
or to topics Kafka refuses side by side; a queue published before keys keeps its topic, and only
such a kept key can still be met. Transport queues keep their names as topics, and their rule."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.catalog.catalog import Catalog
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.objects import Queue, published_key
from kbroker.core.catalog.queue_keys import check_queue_keys, stamp_keys
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


def assert_one_owner_per_kafka_name(owned: dict[str, object]) -> None:
    """`owned`: topic -> who uses it. No two owners on one topic is given by the dict; no two
    topics Kafka would refuse side by side is checked here."""
    forms: dict[str, str] = {}
    for topic in owned:
        other = forms.setdefault(names.kafka_form(topic), topic)
        assert other == topic, f"{topic} ({owned[topic]}) collides in Kafka with {other} ({owned[other]})"


# Any name Service Broker takes: few letters and many separators, so old rules' collisions are
# common, and the rest of Unicode (no control characters, no lone surrogates).
any_names = st.text(alphabet="ab._-", min_size=1, max_size=6) | st.text(
    st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=128
)


@settings(max_examples=400)
@given(st.lists(any_names, max_size=8, unique=True), st.lists(instance_names, max_size=4))
@example(["Orders", "Orders_Archive", "Orders.Retries", "Orders_Retries", "EmployeeQueue.web1"], ["web1", "Archive"])
@example(["X.web1", "X", "X_web1"], ["web1"])
def test_any_queue_names_never_share_or_collide_with_a_topic(queues, instances):
    """Keys are injective and free of '.' and '_': every name of a namespace, with every
    instance's secondary queue, gets a topic of its own that Kafka takes beside the others."""
    owned: dict[str, object] = {}
    names.remember_keys(NS, {q: names.encoded_key(q) for q in queues})  # as the catalog's reader does
    for q in queues:
        topics = [(names.queue_topic(NS, q), ("queue", q))]
        topics += [(names.secondary_queue_topic(NS, q, i), ("secondary", q, i)) for i in instances]
        for topic, owner in topics:
            assert len(topic) <= 249, topic
            assert owned.setdefault(topic, owner) == owner, f"{owner} and {owned[topic]} share {topic}"
            assert names.queue_of_topic(NS, topic) == (q if owner[0] == "queue" else f"{q}.{owner[2]}")
    assert_one_owner_per_kafka_name(owned)
    for q in queues:
        for i in instances:
            assert names.secondary_queue_collision(NS, queues, q, i) is None
        assert names.queue_names_collide(names.encoded_key(q), names.encoded_key(queues[0])) is None


@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=128))
def test_a_key_is_what_kafka_takes_and_says_its_name(name):
    key = names.encoded_key(name)
    assert len(key) <= 120 and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    assert "_" not in key.lstrip("_") and len(key) - len(key.lstrip("_")) <= 2 and "." not in key
    assert names.decoded_key(key) in (name, None) and (names.decoded_key(key) is None) == key.startswith("__")


def test_keys_of_the_issue_names():
    assert [names.encoded_key(q) for q in ("Orders", "Orders_Archive", "Orders.Retries", "Orders-EU")] == [
        "Orders",
        "_Orders-5f-Archive",
        "_Orders-2e-Retries",
        "Orders-EU",  # 1-100 letters, digits and '-': the name itself, as before keys
    ]
    long = "Ω" * 128
    assert names.encoded_key(long).startswith("__") and names.encoded_key(long) != names.encoded_key(long[:-1])
    assert names.decoded_key("_a-zz-b") is None and names.decoded_key("_ab") is None  # not what encoding writes


@pytest.mark.parametrize(
    "key", ["_-d800-", "_a-0-", "_-7f-", "_-110000-", "_-", "_--", "_a-2e", "__x", "a.b", "_" + "-41-" * 200]
)
def test_a_topic_anyone_named_gives_no_name_a_queue_may_not_have(key):
    """Topic names are untrusted: a key that no encoding writes, or that stands for a name with a
    control character or a lone surrogate (orjson and Kafka's headers refuse those), names no
    queue, and the topic stands for itself."""
    assert names.decoded_key(key) is None
    assert names.queue_of_topic(NS, f"kbroker.{NS}.queue.{key}") == key


def test_a_queue_published_before_keys_keeps_its_topic_and_can_still_collide():
    ns = "kept"
    names.remember_keys(ns, {"EmployeeQueue.web1": "EmployeeQueue.web1", "a_b": "a_b"})
    assert names.queue_topic(ns, "EmployeeQueue.web1") == "kbroker.kept.queue.EmployeeQueue.web1"
    assert names.queue_of_topic(ns, "kbroker.kept.queue.a_b") == "a_b"
    assert names.queue_topic(ns, "a.b") == "kbroker.kept.queue._a-2e-b"  # a new one: its key
    # The kept key is in EmployeeQueue's secondary space: that instance is refused, others are not.
    assert names.secondary_queue_collision(ns, ["EmployeeQueue", "EmployeeQueue.web1"], "EmployeeQueue", "web1") == (
        "EmployeeQueue.web1",
        "it would be that queue's topic, or one Kafka refuses beside it ('.' and '_' are one)",
    )
    assert names.secondary_queue_collision(ns, ["EmployeeQueue", "EmployeeQueue.web1"], "EmployeeQueue", "web2") is None
    names.remember_keys(ns, {"a_b": names.encoded_key("a_b")})  # dropped and made again: a key of its own
    assert names.queue_topic(ns, "a_b") == "kbroker.kept.queue._a-5f-b"


def published(ns: str, **queues: str | None) -> Catalog:
    """A catalog as read back: queue name -> its record's key (None: published before keys)."""
    return Catalog(namespace=ns, queues={n: published_key(Queue(name=n, topic_key=k)) for n, k in queues.items()})


def test_apply_keeps_a_published_key_and_encodes_a_new_one():
    previous = published("stamp", **{"Old_Queue": None, "Kept.Too": "_Kept-2e-Too"})
    catalog = Catalog(namespace="stamp", queues={n: Queue(name=n) for n in ("Old_Queue", "Kept.Too", "New_Queue")})
    stamped = stamp_keys(catalog, previous)
    assert {n: q.topic_key for n, q in stamped.queues.items()} == {
        "Old_Queue": "Old_Queue",  # its topic from before keys
        "Kept.Too": "_Kept-2e-Too",
        "New_Queue": "_New-5f-Queue",
    }
    assert names.queue_topic("stamp", "Old_Queue") == "kbroker.stamp.queue.Old_Queue"
    check_queue_keys(stamped, previous)


def test_apply_refuses_a_new_queue_only_where_a_kept_key_claims_its_topic():
    previous = published("clash", **{"X.web1": None, "Y": None})
    with pytest.raises(DefinitionError) as info:
        check_queue_keys(stamp_keys(Catalog(namespace="clash", queues={"X": Queue(name="X")}), previous), previous)
    assert info.value.obj == "queue X" and "collides with queue 'X.web1'" in info.value.reason
    assert "(applied earlier)" in info.value.reason
    fine = Catalog(namespace="clash", queues={n: Queue(name=n) for n in ("X_web1", "X.web2", "Z")})
    check_queue_keys(stamp_keys(fine, previous), previous)  # new names get keys of their own


def test_loader_takes_names_that_once_collided(tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text("queues: [{name: Orders}, {name: Orders_Archive}, {name: Orders.Retries}, {name: 'Заказы [EU]'}]\n")
    assert sorted(load_definitions([f], NS).queues) == ["Orders", "Orders.Retries", "Orders_Archive", "Заказы [EU]"]


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
