"""Routes (CREATE ROUTE): the address forms, matching as Service Broker ranks routes, destinations,
expiry, apply's created_at stamp and `kbroker routes`. Pure: the clock is a number."""

from __future__ import annotations

import textwrap

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kbroker.cli import main
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import Catalog, Route
from kbroker.core.routing.routes import (
    AUTO_CREATED_LOCAL,
    Destination,
    destination,
    expires_at,
    is_expired,
    match_route,
    routes_of,
    stamp_routes,
)
from kbroker.errors import DefinitionError

NOW = 1_700_000_000.0

# --- the address ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, bootstrap, namespace",
    [
        ({"address": "LOCAL"}, None, None),
        ({"address": "local"}, None, None),
        ({"address": "transport"}, None, None),
        ({"address": "kafka://h:9092/sales"}, "h:9092", "sales"),
        ({"address": "kafka://h1:9092,h2.example.com:9093/Sales_2-b"}, "h1:9092,h2.example.com:9093", "Sales_2-b"),
        ({"address": "kafka://h:9092/sales", "broker_instance": "other"}, "h:9092", "sales"),  # forwarded
        ({"address": "kafka://h:9092", "broker_instance": "sales"}, "h:9092", "sales"),  # the old form
        (
            {
                "address": "kafka://h:1/a",
                "service_name": "S",
                "broker_instance": "b",
                "mirror_address": "kafka://m:2/b2",
            },
            "h:1",
            "a",
        ),
        (
            {"address": "kafka://h:1/a", "service_name": "S", "broker_instance": "b", "mirror_address": "kafka://m:2"},
            "h:1",
            "a",
        ),
    ],
)
def test_valid_addresses(fields, bootstrap, namespace):
    r = Route(name="R", **fields)
    assert (r.bootstrap, r.namespace) == (bootstrap, namespace)


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"address": "tcp://h:4022"}, "address must be"),
        ({"address": "kafka://h:70000/ns"}, "address must be"),
        ({"address": "kafka://h:0/ns"}, "address must be"),
        ({"address": "kafka://h/ns"}, "address must be"),
        ({"address": "kafka://h:1/"}, "address must be"),
        ({"address": "kafka://h:1/ns/more"}, "address must be"),
        ({"address": "kafka://h:1/bad.ns"}, "address must be"),
        ({"address": "kafka://h:1/" + "n" * 41}, "address must be"),
        ({"address": "kafka://h:1"}, "names no namespace"),
        ({"address": 7}, "address must be"),
        ({"address": "LOCAL", "broker_instance": "not a namespace"}, "broker_instance must be a namespace"),
        ({"address": "TRANSPORT", "service_name": "S"}, "TRANSPORT"),
        ({"address": "TRANSPORT", "broker_instance": "b"}, "TRANSPORT"),
        (
            {"address": "LOCAL", "service_name": "S", "broker_instance": "b", "mirror_address": "kafka://m:1/x"},
            "cannot be combined",
        ),
        ({"address": "TRANSPORT", "mirror_address": "kafka://m:1/x"}, "cannot be combined"),
        ({"address": "kafka://h:1/a", "broker_instance": "b", "mirror_address": "kafka://m:1/x"}, "requires both"),
        ({"address": "kafka://h:1/a", "service_name": "S", "mirror_address": "kafka://m:1/x"}, "requires both"),
        (
            {"address": "kafka://h:1/a", "service_name": "S", "broker_instance": "b", "mirror_address": "LOCAL"},
            "mirror_address must be",
        ),
        (
            {"address": "LOCAL", "service_name": "SQL/ServiceBroker/BrokerConfiguration", "broker_instance": "b"},
            "BrokerConfiguration",
        ),
        ({"address": "LOCAL", "service_name": ""}, "service_name"),
        ({"address": "LOCAL", "lifetime": 0}, "lifetime"),
        ({"address": "LOCAL", "created_at": -1}, "created_at"),
        ({"address": "LOCAL", "port": 1}, "port"),
    ],
)
def test_invalid_routes_are_typed_validation_errors(fields, reason):
    with pytest.raises(ValidationError, match=reason):
        Route(name="R", **fields)


def test_a_route_survives_the_catalog_json():
    r = Route(
        name="R",
        service_name="S",
        address="kafka://h:1/a",
        broker_instance="b",
        mirror_address="kafka://m:2/c",
        lifetime=60,
        created_at=NOW,
    )
    back = Catalog.from_json(Catalog(namespace="ns", routes={"R": r}).to_json())
    assert back.routes["R"] == r


def write(tmp_path, text):
    f = tmp_path / "routes.yaml"
    f.write_text(textwrap.dedent(text))
    return f


def test_the_loader_takes_remote_routes_to_services_defined_elsewhere(tmp_path):
    f = write(
        tmp_path,
        """
        routes:
          - {name: R, service_name: //Remote/Service, address: "kafka://h:9092/sales", lifetime: 60}
          - {name: M, service_name: //Remote/Service, broker_instance: sales, address: "kafka://h:9092",
             mirror_address: "kafka://m:9092/standby"}
    """,
    )
    c = load_definitions([f], "ns")
    assert c.routes["R"].namespace == "sales" and c.routes["M"].created_at is None


@pytest.mark.parametrize(
    "text, reason",
    [
        ("routes: [{name: R, address: LOCAL, created_at: 5}]\n", "created_at is set by 'kbroker apply'"),
        ("routes: [{name: R, service_name: Ghost, address: LOCAL}]\n", "service 'Ghost' is not defined"),
        ("routes: [{name: R, address: 'kafka://h:1'}]\n", "names no namespace"),
    ],
)
def test_the_loader_refuses(tmp_path, text, reason):
    with pytest.raises(DefinitionError, match=reason) as err:
        load_definitions([write(tmp_path, text)], "ns")
    assert err.value.obj == "route R"


# --- expiry -------------------------------------------------------------------------------------


def test_expiry_counts_from_created_at():
    r = Route(name="R", address="LOCAL", lifetime=60, created_at=NOW)
    assert expires_at(r) == NOW + 60
    assert not is_expired(r, NOW + 59.9) and is_expired(r, NOW + 60)


@pytest.mark.parametrize(
    "route",
    [
        Route(name="R", address="LOCAL"),
        Route(name="R", address="LOCAL", created_at=NOW),
        Route(name="R", address="LOCAL", lifetime=1),
    ],
)  # never applied: no start
def test_without_lifetime_or_created_at_a_route_never_expires(route):
    assert expires_at(route) is None and not is_expired(route, 10**12)


# --- matching: examples -------------------------------------------------------------------------


def local(name, service=None, instance=None, **kw):
    return Route(name=name, address="LOCAL", service_name=service, broker_instance=instance, **kw)


def remote(name, service=None, instance=None, **kw):
    return Route(
        name=name, address=f"kafka://h:1/{instance or 'x'}", service_name=service, broker_instance=instance, **kw
    )


TRANSPORT = Route(name="T", address="TRANSPORT")


def test_every_namespace_has_auto_created_local():
    assert routes_of(Catalog(namespace="ns")) == [AUTO_CREATED_LOCAL]
    assert match_route(routes_of(Catalog(namespace="ns")), "S", None, NOW) is AUTO_CREATED_LOCAL
    own = remote("AutoCreatedLocal")  # the catalog's own route of that name replaces it
    assert routes_of(Catalog(namespace="ns", routes={own.name: own})) == [own]


def test_service_then_instance_then_transport():
    routes = [
        TRANSPORT,
        local("any"),
        remote("any@b", instance="b"),
        remote("S", "S"),
        remote("S@b", "S", "b"),
        remote("S@c", "S", "c"),
        remote("Other", "Other"),
    ]
    assert match_route(routes, "S", "b", NOW).name == "S@b"
    assert match_route(routes, "S", None, NOW).name == "S"  # no instance named: the unnamed one first
    assert match_route(routes, "S", "z", NOW).name == "S"  # S@b, S@c name another instance
    assert match_route(routes, "U", "b", NOW).name == "any@b"
    assert match_route(routes, "U", None, NOW).name == "any"
    assert match_route([TRANSPORT, remote("any@b", instance="b")], "U", None, NOW).name == "any@b"
    assert match_route([TRANSPORT, remote("S@c", "S", "c")], "S", "b", NOW) is TRANSPORT
    assert match_route([remote("S@c", "S", "c")], "S", "b", NOW) is None


def test_service_names_match_byte_for_byte():
    routes = [remote("R", "//Sales/Orders")]
    assert match_route(routes, "//Sales/Orders", None, NOW) is not None
    assert match_route(routes, "//sales/orders", None, NOW) is None
    assert match_route(routes, "//Sales/Orders ", None, NOW) is None


def test_expired_routes_are_ignored_and_ties_go_to_the_smallest_name():
    routes = [remote("b", "S"), remote("a", "S", lifetime=10, created_at=NOW - 10), remote("c", "S")]
    assert match_route(routes, "S", None, NOW).name == "b"
    assert match_route(routes, "S", None, NOW - 1).name == "a"
    assert match_route([remote("a", "S", lifetime=10, created_at=NOW - 10)], "S", None, NOW) is None


# --- matching: properties -----------------------------------------------------------------------

SERVICES = ["S", "s", "U"]
INSTANCES = [None, "b", "c"]


@st.composite
def route_lists(draw, min_size=0):
    """Routes of distinct names (as a catalog's are), of every kind, some expired at NOW."""
    kinds = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["LOCAL", "REMOTE", "TRANSPORT"]),
            "service": st.sampled_from([None, *SERVICES]),
            "instance": st.sampled_from(INSTANCES),
            "expired": st.booleans(),
        }
    )
    specs = draw(st.lists(kinds, min_size=min_size, max_size=8))
    names = draw(
        st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=len(specs), max_size=len(specs), unique=True)
    )
    return [make(name, **spec) for name, spec in zip(names, specs)]


def make(name, kind, service, instance, expired):
    timing = {"lifetime": 10, "created_at": NOW - (10 if expired else 5)}
    if kind == "TRANSPORT":
        return Route(name=name, address="TRANSPORT", **timing)
    build = local if kind == "LOCAL" else remote
    return build(name, service, instance, **timing)


dialogs = st.tuples(st.sampled_from(SERVICES), st.sampled_from(INSTANCES))


@settings(max_examples=300)
@given(route_lists(), dialogs, st.randoms())
def test_the_match_does_not_depend_on_the_order_of_the_routes(routes, dialog, rnd):
    shuffled = list(routes)
    rnd.shuffle(shuffled)
    assert match_route(shuffled, *dialog, NOW) == match_route(routes, *dialog, NOW)


@settings(max_examples=300)
@given(
    route_lists(),
    dialogs,
    st.sampled_from(["LOCAL", "REMOTE", "TRANSPORT"]),
    st.sampled_from([None, *SERVICES]),
    st.sampled_from(INSTANCES),
)
def test_adding_an_expired_route_never_changes_the_match(routes, dialog, kind, service, instance):
    extra = make("zz-expired", kind, service, instance, expired=True)
    assert match_route([*routes, extra], *dialog, NOW) == match_route(routes, *dialog, NOW)


@settings(max_examples=300)
@given(route_lists(), dialogs)
def test_the_match_is_a_live_route_that_applies_to_the_dialog(routes, dialog):
    service, instance = dialog
    got = match_route(routes, service, instance, NOW)
    if got is None:
        return
    assert not is_expired(got, NOW)
    assert got.service_name in (None, service)
    assert got.broker_instance is None or instance is None or got.broker_instance == instance


@settings(max_examples=300)
@given(route_lists(), dialogs, st.sampled_from(INSTANCES))
def test_a_route_naming_the_service_beats_every_route_naming_none(routes, dialog, route_instance):
    service, instance = dialog
    if route_instance is not None and instance is not None and route_instance != instance:
        route_instance = instance  # a route naming another instance never matches at all
    named = remote("zz-named", service, route_instance)
    got = match_route([*routes, named], service, instance, NOW)
    assert got is not None and got.service_name == service


@settings(max_examples=300)
@given(route_lists(min_size=1), dialogs)
def test_transport_is_chosen_only_when_nothing_else_matches(routes, dialog):
    got = match_route(routes, *dialog, NOW)
    if got is not None and got.address == "TRANSPORT":
        others = [r for r in routes if r.address != "TRANSPORT"]
        assert match_route(others, *dialog, NOW) is None


@settings(max_examples=300)
@given(route_lists(), st.sampled_from(SERVICES), st.sampled_from(["b", "c"]))
def test_the_instance_named_ranks_first_and_no_instance_ranks_first_without_one(routes, service, instance):
    # Beside a route of each kind naming the service, the instance rule alone decides the winner.
    both = [*routes, remote("zz-with", service, instance), remote("zz-without", service)]
    named = match_route(both, service, instance, NOW)
    unnamed = match_route(both, service, None, NOW)
    assert named.service_name == service and named.broker_instance == instance
    assert unnamed.service_name == service and unnamed.broker_instance is None


# --- destinations -------------------------------------------------------------------------------


def test_destinations():
    assert destination(local("L"), "S") == Destination("LOCAL", None, None, "L")
    assert destination(remote("R", instance="sales"), "S") == Destination("REMOTE", "h:1", "sales", "R")
    old_form = Route(name="O", address="kafka://h:1,g:2", broker_instance="sales")
    assert destination(old_form, "S") == Destination("REMOTE", "h:1,g:2", "sales", "O")


@pytest.mark.parametrize(
    "service, expected",
    [
        ("kafka://h:9092/sales/Orders", ("h:9092", "sales")),
        ("kafka://h:9092,g:9093/sales//Adventure-Works.com/Expenses", ("h:9092,g:9093", "sales")),
        ("kafka://h:9092/sales", None),  # no service after the namespace
        ("kafka://h:9092/sales/", None),
        ("kafka://h/sales/Orders", None),
        ("kafka://h:99999/sales/Orders", None),
        ("kafka://h:9092/bad.ns/Orders", None),
        ("//Adventure-Works.com/Expenses", None),
        ("tcp://h:4022/Orders", None),
    ],
)
def test_transport_takes_the_address_from_the_service_name(service, expected):
    got = destination(TRANSPORT, service)
    if expected is None:
        assert got is None
    else:
        assert got == Destination("REMOTE", *expected, "T")


# --- apply's created_at -------------------------------------------------------------------------


def test_apply_stamps_new_and_changed_routes_and_keeps_the_rest():
    published = {
        "Same": local("Same", lifetime=60, created_at=NOW - 100),
        "Changed": local("Changed", lifetime=60, created_at=NOW - 100),
        "Legacy": local("Legacy", lifetime=60),
    }  # published before apply stamped routes
    applied = Catalog(
        namespace="ns",
        routes={
            "Same": local("Same", lifetime=60),
            "Changed": local("Changed", lifetime=120),
            "Legacy": local("Legacy", lifetime=60),
            "New": local("New"),
        },
        origins={"route New": "x.yaml"},
    )
    got = stamp_routes(applied, published, NOW)
    assert {n: r.created_at for n, r in got.routes.items()} == {
        "Same": NOW - 100,
        "Changed": NOW,
        "Legacy": NOW,
        "New": NOW,
    }
    assert got.origins == {"route New": "x.yaml"}  # what the loader kept for error messages
    assert got.routes["Changed"].lifetime == 120


def test_applying_the_same_routes_again_changes_no_record():
    from kbroker.kafka.catalog.catalog_store import records  # what publish compares

    applied = Catalog(namespace="ns", routes={"R": remote("R", "S", "b", lifetime=60)})
    first = stamp_routes(applied, {}, NOW)
    again = stamp_routes(applied, first.routes, NOW + 500)
    assert records(again) == records(first)


# --- kbroker routes -----------------------------------------------------------------------------


def test_kbroker_routes_json(monkeypatch):
    import kbroker.kafka.catalog.catalog_store as store

    catalog = Catalog(
        namespace="ns",
        routes={
            "Orders": Route(
                name="Orders",
                service_name="//Orders",
                address="kafka://h:1/sales",
                broker_instance="sales",
                mirror_address="kafka://m:1/standby",
                lifetime=60,
                created_at=0.0,
            ),
            "Live": Route(name="Live", address="LOCAL", lifetime=10**10, created_at=0.0),
        },
    )
    asked = []
    monkeypatch.setattr(store, "read_catalog", lambda bootstrap, ns: asked.append((bootstrap, ns)) or catalog)
    result = CliRunner().invoke(main, ["routes", "--json", "--bootstrap", "b:1", "--namespace", "ns"])
    assert result.exit_code == 0, result.output
    assert [(str(cluster), ns) for cluster, ns in asked] == [("b:1", "ns")]  # the CLI hands on a Cluster
    rows = orjson.loads(result.output)
    assert [r["name"] for r in rows] == ["AutoCreatedLocal", "Live", "Orders"]
    assert rows[0] == {
        "name": "AutoCreatedLocal",
        "service": None,
        "broker_instance": None,
        "address": "LOCAL",
        "mirror_address": None,
        "profile": None,
        "lifetime": None,
        "created_at": None,
        "expires_at": None,
        "expired": False,
    }
    assert rows[2] == {
        "name": "Orders",
        "service": "//Orders",
        "broker_instance": "sales",
        "address": "kafka://h:1/sales",
        "mirror_address": "kafka://m:1/standby",
        "profile": None,
        "lifetime": 60,
        "created_at": "1970-01-01T00:00:00+00:00",
        "expires_at": "1970-01-01T00:01:00+00:00",
        "expired": True,
    }
    assert rows[1]["expired"] is False


def test_kbroker_routes_table_and_errors(monkeypatch):
    import kbroker.kafka.catalog.catalog_store as store
    from kbroker.errors import BrokerUnavailableError

    monkeypatch.setattr(store, "read_catalog", lambda bootstrap, ns: Catalog(namespace=ns))
    result = CliRunner().invoke(main, ["routes", "--bootstrap", "b:1", "--namespace", "ns"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "routes of ns"
    assert result.output.splitlines()[2].split() == ["AutoCreatedLocal", "*", "*", "LOCAL", "-", "-", "never", "no"]

    def down(bootstrap, ns):
        raise BrokerUnavailableError("no Kafka broker answers at b:1")

    monkeypatch.setattr(store, "read_catalog", down)
    result = CliRunner().invoke(main, ["routes", "--bootstrap", "b:1"])
    assert (result.exit_code, result.output) == (1, "kbroker: error: no Kafka broker answers at b:1\n")


def test_hop_is_where_a_route_leads_a_service_next():
    from kbroker.core.routing.routes import hop

    here = "h:1/me"
    assert hop(Route(name="L", address="LOCAL"), "//S", here) == here
    assert hop(Route(name="R", address="kafka://k:9092,k2:9092/far"), "//S", here) == "k:9092,k2:9092/far"
    assert hop(Route(name="T", address="TRANSPORT"), "kafka://t:1/ns/svc", here) == "t:1/ns"
    assert hop(Route(name="T", address="TRANSPORT"), "//not-an-address", here) is None
