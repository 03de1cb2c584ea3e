"""A transport endpoint's pure rules (core/transport/endpoint.py): settings and queue names, the
concurrency model's spellings, the installer's plan (its permission split: test_acl_roles.py),
3.0's receive-task arithmetic and the in-memory count of failed deliveries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.transport.endpoint import (
    FIXED,
    MAX_DELIVERIES,
    MONITOR,
    PRIMARY_PARTITIONS,
    RAMP,
    SECONDARY_PARTITIONS,
    FailedDeliveries,
    InstallPlan,
    TransportSettings,
    address_topic,
    default_machine,
    install_plan,
    model_name,
    parse_address,
    receive_tasks_to_start,
    transport_queue_topic,
)

NS = "sales"


# --- settings and queue names ------------------------------------------------------------------


def test_defaults():
    s = TransportSettings("Sales", "m1")
    assert (s.model, s.max_concurrency, s.secondary_readers, s.max_deliveries, s.secondary, s.satellite) == (
        MONITOR,
        8,
        1,
        MAX_DELIVERIES,
        True,
        False,
    )


def test_queue_names_with_a_secondary():
    s = TransportSettings("Sales", "m1")
    assert (s.primary_queue, s.secondary_queue, s.reply_address) == ("Sales", "Sales.m1", "Sales.m1")


def test_a_disabled_secondary_replies_to_the_primary():
    s = TransportSettings("Sales", "m1", secondary=False)
    assert (s.primary_queue, s.secondary_queue, s.reply_address) == ("Sales", None, "Sales")


def test_a_satellite_has_no_secondary_queue():
    s = TransportSettings("Sales.Retries", "m1", satellite=True)
    assert (s.secondary_queue, s.reply_address) == (None, "Sales.Retries")


def test_dotted_endpoint_names_are_fine():
    assert TransportSettings("Company.Sales", "m-1_x").secondary_queue == "Company.Sales.m-1_x"


@pytest.mark.parametrize("name", ["", "a/b", "a b", "x" * 151, "Säles", None])
def test_a_bad_endpoint_name_is_refused(name):
    with pytest.raises(ValueError, match="endpoint name"):
        TransportSettings(name, "m1")


def test_the_longest_endpoint_name():
    assert TransportSettings("x" * 150, "m").primary_queue == "x" * 150


@pytest.mark.parametrize("machine", ["", "m.1", "m 1", "x" * 65, "m/1", None])
def test_a_bad_machine_name_is_refused(machine):
    # no '.': `Endpoint.Machine` must stay one queue name
    with pytest.raises(ValueError, match="machine name"):
        TransportSettings("Sales", machine)


@pytest.mark.parametrize("field", ["max_concurrency", "secondary_readers", "max_deliveries"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_counts_must_be_whole_numbers_of_at_least_one(field, value):
    with pytest.raises(ValueError, match=field):
        TransportSettings("Sales", "m1", **{field: value})


def test_the_default_machine_is_a_valid_queue_suffix():
    machine = default_machine()
    assert TransportSettings("Sales", machine).secondary_queue == f"Sales.{machine}"


def test_transport_queue_topic():
    assert transport_queue_topic(NS, "Sales") == "kbroker.sales.tqueue.Sales"
    assert transport_queue_topic(NS, "Sales.m1") == "kbroker.sales.tqueue.Sales.m1"
    assert transport_queue_topic(NS, "Sales").startswith(names.prefix(NS))
    for bad in ("", "a/b", "x" * 151, None):
        with pytest.raises(ValueError, match="transport queue name"):
            transport_queue_topic(NS, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace"):
        transport_queue_topic("bad ns", "Sales")


# --- concurrency models -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling,model",
    [
        ("fixed", FIXED),
        ("pre-2.0", FIXED),
        ("PRE-2.0", FIXED),
        (" Fixed ", FIXED),
        ("ramp", RAMP),
        ("2.1", RAMP),
        ("Ramp", RAMP),
        ("monitor", MONITOR),
        ("3.0", MONITOR),
        ("MONITOR", MONITOR),
    ],
)
def test_model_name_aliases(spelling, model):
    assert model_name(spelling) == model
    assert TransportSettings("Sales", "m1", model=spelling).model == model


@pytest.mark.parametrize("spelling", ["", "2.0", "3", "adaptive", None])
def test_an_unknown_model_is_refused(spelling):
    with pytest.raises(ValueError, match="concurrency model"):
        model_name(spelling)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency model"):
        TransportSettings("Sales", "m1", model=spelling)  # type: ignore[arg-type]


# --- installer plan -------------------------------------------------------------------------------


def test_install_plan_of_an_instance():
    assert install_plan("Sales", "m1") == InstallPlan(
        (("Sales", PRIMARY_PARTITIONS), ("Sales.m1", SECONDARY_PARTITIONS)), delayed="Sales", error="error"
    )
    assert SECONDARY_PARTITIONS == 1


def test_install_plan_without_a_machine_or_secondary_is_the_primary_only():
    assert install_plan("Sales", None) == InstallPlan((("Sales", PRIMARY_PARTITIONS),), delayed="Sales", error="error")
    assert install_plan("Sales", "m1", secondary=False) == InstallPlan(
        (("Sales", PRIMARY_PARTITIONS),), delayed="Sales", error="error"
    )
    assert install_plan("Sales", None, error_queue=None).error is None


def test_a_satellite_has_no_delayed_store():
    assert install_plan("Sales.Retries", None, satellite=True).delayed is None


def test_install_plan_partitions():
    assert install_plan("Sales", "m1", partitions=12).queues == (("Sales", 12), ("Sales.m1", 1))


def test_install_plan_validates_names():
    with pytest.raises(ValueError):
        install_plan("a/b", "m1")
    with pytest.raises(ValueError):
        install_plan("Sales", "m.1")


# --- 3.0 receive tasks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "waiting,running,mx,start",
    [
        (0, 0, 4, 0),
        (3, 0, 4, 3),
        (10, 0, 4, 4),
        (10, 3, 4, 1),
        (10, 4, 4, 0),
        (1, 4, 4, 0),
        (5, 6, 4, 0),
    ],
)
def test_receive_tasks_to_start(waiting, running, mx, start):
    assert receive_tasks_to_start(waiting, running, mx) == start


@given(st.integers(-5, 1000), st.integers(0, 100), st.integers(1, 64))
def test_receive_tasks_never_exceed_the_maximum(waiting, running, mx):
    n = receive_tasks_to_start(waiting, running, mx)
    assert n >= 0
    assert n <= max(waiting, 0)
    assert running + n <= max(mx, running)
    if running < mx and waiting > 0:
        assert n >= 1  # work and a free slot: a task starts


# --- failed deliveries -------------------------------------------------------------------------------


def test_failed_deliveries_count_and_reason():
    f = FailedDeliveries()
    pos = ("t", 0, 5)
    assert (f.count(pos), f.reason(pos)) == (0, "")
    assert f.failed(pos, "boom") == 1
    assert f.failed(pos, "bang") == 2
    assert (f.count(pos), f.reason(pos)) == (2, "bang")
    assert f.count(("t", 1, 5)) == 0 and f.count(("u", 0, 5)) == 0


def test_failed_deliveries_forget():
    f = FailedDeliveries()
    f.failed(("t", 0, 1))
    f.forget(("t", 0, 1))
    f.forget(("t", 0, 2))  # unknown: nothing happens
    assert f.count(("t", 0, 1)) == 0
    assert f.failed(("t", 0, 1)) == 1


def test_failed_deliveries_cap_drops_the_oldest():
    f = FailedDeliveries(cap=3)
    for off in range(3):
        f.failed(("t", 0, off))
    f.failed(("t", 0, 0))  # failed again: now the newest
    f.failed(("t", 0, 3))  # over the cap: ("t", 0, 1) was the oldest
    assert [f.count(("t", 0, off)) for off in range(4)] == [2, 0, 1, 1]
    for off in range(10, 20):
        f.failed(("t", 0, off))
    assert sum(f.count(("t", 0, off)) > 0 for off in range(20)) == 3


@pytest.mark.parametrize(
    ("address", "expected"),
    [("Billing", ("Billing", "sales")), ("Billing@finance", ("Billing", "finance")), ("B.m1@x-1", ("B.m1", "x-1"))],
)
def test_a_transport_address_is_a_queue_perhaps_of_another_namespace(address, expected):
    assert parse_address(address, "sales") == expected
    assert address_topic(address, "sales") == f"kbroker.{expected[1]}.tqueue.{expected[0]}"


@pytest.mark.parametrize(
    "address", ["", "@ns", "Billing@", "Billing@bad ns", "Billing@ns@more", "Bil ling", "Billing@ns\n"]
)
def test_a_bad_transport_address_is_refused(address):
    with pytest.raises(ValueError):
        parse_address(address, "sales")
