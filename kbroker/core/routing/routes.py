"""Route matching as Service Broker does it (CREATE ROUTE; docs/sources.md, items 35-44). Pure: the
caller passes the clock, so expiry is tested without waiting.

Which route a dialog to `service` (naming `broker_instance` or not) takes, best first:

1. expired routes are ignored; so are routes naming another service (byte-exact) or another
   broker instance;
2. a route naming the service beats one naming none;
3. when the dialog names an instance, a route naming it beats one naming none; when the dialog
   names none, a route naming none beats one naming an instance;
4. TRANSPORT ranks below every other route;
5. ties go to the smallest route name (Service Broker balances over them; a fixed choice keeps
   one dialog's messages on one path and the tests reproducible).

Every namespace has AutoCreatedLocal (LOCAL, any service, any instance) unless its catalog
defines a route of that name: `routes_of` adds it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from kbroker.core.catalog.models import Catalog, Route, parse_kafka_address

AUTO_CREATED_LOCAL = Route(name="AutoCreatedLocal", address="LOCAL")

# A TRANSPORT route's address is the service name: kafka://host:port[,host:port]/<namespace>/<name>.
_TRANSPORT_SERVICE_RE = re.compile(r"(kafka://[^/]+/[^/]+)/.+", re.DOTALL)


@dataclass(frozen=True)
class Destination:
    """Where a route sends a dialog's messages: this namespace, or a namespace of some Kafka
    cluster (which may be this one's; the caller compares)."""

    kind: Literal["LOCAL", "REMOTE"]
    bootstrap: str | None  # host:port[,host:port] of a REMOTE destination
    namespace: str | None  # the namespace of a REMOTE destination
    route: str  # the route's name, for views and errors


def routes_of(catalog: Catalog) -> list[Route]:
    """The catalog's routes, with AutoCreatedLocal unless the catalog defines that name."""
    routes = list(catalog.routes.values())
    if AUTO_CREATED_LOCAL.name not in catalog.routes:
        routes.append(AUTO_CREATED_LOCAL)
    return routes


def expires_at(route: Route) -> float | None:
    """Epoch seconds at which the route expires: created_at + lifetime. None when it never does,
    including a route with a lifetime but no created_at (never applied by `kbroker apply`, e.g.
    built in code): without a start there is no end, so it counts as not expired."""
    if route.lifetime is None or route.created_at is None:
        return None
    return route.created_at + route.lifetime


def is_expired(route: Route, now: float) -> bool:
    """Whether the route has expired at `now` (epoch seconds); it expires at expires_at itself."""
    at = expires_at(route)
    return at is not None and now >= at


def match_route(routes: Iterable[Route], service: str, broker_instance: str | None, now: float) -> Route | None:
    """The route a dialog to `service` takes (see the module for the rules); None when no route
    matches, as when every route has expired."""
    best: tuple[tuple[int, int, int, str], Route] | None = None
    for route in routes:
        key = _rank(route, service, broker_instance, now)
        if key is not None and (best is None or key < best[0]):
            best = (key, route)
    return best[1] if best else None


def _rank(route: Route, service: str, broker_instance: str | None, now: float) -> tuple[int, int, int, str] | None:
    # Smaller is better; None: the route does not match at all.
    if is_expired(route, now):
        return None
    if route.service_name is not None and route.service_name != service:
        return None
    if route.broker_instance is not None and broker_instance is not None and route.broker_instance != broker_instance:
        return None
    transport = int(route.address == "TRANSPORT")
    unnamed_service = int(route.service_name is None)
    # Dialog names an instance: a route naming it (the only instance left) ranks first. Dialog
    # names none: a route naming none ranks first.
    instance = (
        int(route.broker_instance is None) if broker_instance is not None else int(route.broker_instance is not None)
    )
    return transport, unnamed_service, instance, route.name


def destination(route: Route, service: str) -> Destination | None:
    """Where `route` sends messages to `service`. A TRANSPORT route's address is the service name
    itself, `kafka://host:port[,host:port]/<namespace>/<name>`: None (no destination, as Service
    Broker has none) for a service not named so."""
    if route.address == "LOCAL":
        return Destination("LOCAL", None, None, route.name)
    if route.address == "TRANSPORT":
        m = _TRANSPORT_SERVICE_RE.fullmatch(service)
        parsed = parse_kafka_address(m[1]) if m else None
        if parsed is None or parsed[1] is None:
            return None
        return Destination("REMOTE", parsed[0], parsed[1], route.name)
    return Destination("REMOTE", route.bootstrap, route.namespace, route.name)


def address(bootstrap: str, namespace: str) -> str:
    """A namespace's link address, `<bootstrap>/<namespace>`: what a hop is, and what
    connections are keyed by."""
    return f"{bootstrap}/{namespace}"


def parse_address(dest: str) -> tuple[str, str]:
    """(bootstrap, namespace) of a link address."""
    bootstrap, _, namespace = dest.rpartition("/")
    return bootstrap, namespace


def hop(route: Route, service: str, here: str) -> str | None:
    """The next hop, `<bootstrap>/<namespace>`, that `route` gives messages to `service`: `here`
    (this namespace's own) for LOCAL; None when it gives none."""
    dest = destination(route, service)
    if dest is None:
        return None
    if dest.kind == "LOCAL":
        return here
    assert dest.bootstrap is not None and dest.namespace is not None  # a REMOTE destination has both
    return address(dest.bootstrap, dest.namespace)


def stamp_routes(catalog: Catalog, published: Mapping[str, Route], now: float) -> Catalog:
    """The catalog `kbroker apply` publishes: each route keeps the created_at of the `published`
    route of its name when its definition is the same, and gets `now` (epoch seconds) when it is
    new or changed (as ALTER ROUTE restarts its LIFETIME). Re-applying the same files thus
    publishes nothing."""
    routes: dict[str, Route] = {}
    for name, route in catalog.routes.items():
        old = published.get(name)
        same = old is not None and old.model_copy(update={"created_at": None}) == route.model_copy(
            update={"created_at": None}
        )
        # A route published before apply stamped routes has no created_at: stamp it once now,
        # or its lifetime would never start.
        created = old.created_at if same and old is not None and old.created_at is not None else now
        routes[name] = route.model_copy(update={"created_at": created})
    return catalog.model_copy(update={"routes": routes})
