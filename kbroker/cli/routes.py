"""`kbroker routes`: the namespace's routes as published (sys.routes), AutoCreatedLocal included."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kbroker.cli.common import (
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    main,
)
from kbroker.cli.output import new_table, print_table

if TYPE_CHECKING:
    from kbroker.core.catalog.models import Catalog


@main.command("routes")
@cluster_options
@json_option
@handle_errors
def routes_cmd(target, as_json):
    """The routes of the namespace (sys.routes), with when each expires; AutoCreatedLocal is
    listed unless the catalog defines a route of that name."""
    from kbroker.kafka.catalog.catalog_store import read_catalog

    ns = target.namespace
    rows = route_rows(read_catalog(target.cluster, ns), time.time())
    if as_json:
        emit_json(rows)
        return
    t = new_table(
        f"routes of {ns}",
        "name",
        "service",
        "broker_instance",
        "address",
        "mirror_address",
        "lifetime",
        "expires_at",
        "expired",
    )
    for r in rows:
        t.add_row(
            r["name"],
            r["service"] or "*",
            r["broker_instance"] or "*",
            r["address"],
            r["mirror_address"] or "-",
            "-" if r["lifetime"] is None else str(r["lifetime"]),
            r["expires_at"] or "never",
            "yes" if r["expired"] else "no",
        )
    print_table(t)


def route_rows(catalog: Catalog, now: float) -> list[dict[str, Any]]:
    """One row per route, by name: its definition, created_at and expires_at (ISO 8601, UTC, or
    None) and whether it has expired at `now`."""
    from kbroker.core.routing.routes import expires_at, is_expired, routes_of
    from kbroker.worker.web.views import iso_utc

    return [
        {
            "name": r.name,
            "service": r.service_name,
            "broker_instance": r.broker_instance,
            "address": r.address,
            "mirror_address": r.mirror_address,
            "profile": r.profile,
            "lifetime": r.lifetime,
            "created_at": iso_utc(r.created_at),
            "expires_at": iso_utc(expires_at(r)),
            "expired": is_expired(r, now),
        }
        for r in sorted(routes_of(catalog), key=lambda r: r.name)
    ]
