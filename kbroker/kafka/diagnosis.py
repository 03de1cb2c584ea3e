"""`kbroker diagnose`: CONFIGURATION reads both ends' catalogs (following the from-side's route to
find the far one, as a message would) and asks the far cluster; RUNTIME measures the namespace's
queues (with their readers' locks), its transmission queue, the Kafka transactions open on its
topics and the analytics job's newest figures. core/diagnosis.py and core/runtime_diagnosis.py judge."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.catalog.models import Queue
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.diagnosis import ERROR, Access, Problem, Side, access, configuration
from kbroker.core.routing.routes import address, match_route, routes_of
from kbroker.core.runtime_diagnosis import STUCK_AFTER_S, QueueState, runtime
from kbroker.core.runtime_diagnosis import conversation as conversation_problems
from kbroker.errors import CatalogError, KBrokerError
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.clients import brokers_answering, principal
from kbroker.kafka.dialogs.conversation_endpoints import read_endpoints
from kbroker.kafka.profiles import ClusterProfiles
from kbroker.kafka.queue_views import queue_view_of
from kbroker.kafka.receive.rollbacks import recent_rollbacks
from kbroker.kafka.routing.views import transmission_rows
from kbroker.kafka.security.permissions import authorized
from kbroker.kafka.snapshot import latest_values
from kbroker.kafka.txn.open_transactions import open_transactions


def diagnose_configuration(
    cluster: ClusterLike,
    namespace: str,
    from_service: str,
    to_service: str,
    contract: str,
    *,
    to_cluster: ClusterLike | None = None,
    to_namespace: str | None = None,
    timeout: float = 10.0,
) -> tuple[list[Problem], dict[str, str | None]]:
    """The problems of a dialog from `from_service` in `namespace` to `to_service`, and where the
    far end was looked for ({"from": address, "to": address or None}). The far end is
    `to_namespace` on `to_cluster` (default: this cluster) when given, else where the from-side's
    route for `to_service` leads, reached with the route's client profile."""
    here = Cluster.of(cluster)
    frm = Side(namespace, address(here.bootstrap, namespace), read_catalog(here, namespace, timeout))
    now = time.time()
    far: Cluster | None = None
    far_ns = to_namespace
    if to_namespace is not None:
        far = Cluster.of(to_cluster) if to_cluster is not None else here
    else:
        route = match_route(routes_of(frm.catalog), to_service, None, now)
        if route is not None and route.address == "LOCAL":
            far, far_ns = here, namespace
        elif route is not None and route.bootstrap and route.namespace:
            far_ns = route.namespace
            try:
                far = ClusterProfiles(here).cluster_for(route.bootstrap, route.profile)
            except KBrokerError as exc:
                return configuration(frm, from_service, None, to_service, contract, now) + [
                    Problem("profile_unusable", ERROR, namespace, f"route {route.name!r}: {exc}")
                ], {"from": frm.address, "to": None}
    if far is None or far_ns is None:  # no route to follow: the from-side's problems alone
        return configuration(frm, from_service, None, to_service, contract, now), {"from": frm.address, "to": None}
    to_address = address(far.bootstrap, far_ns)
    where: dict[str, str | None] = {"from": frm.address, "to": to_address}
    try:
        if far.bootstrap != here.bootstrap:
            brokers_answering(far, timeout)
        far_catalog = read_catalog(far, far_ns, timeout)
    except KBrokerError as exc:
        return configuration(frm, from_service, None, to_service, contract, now) + [
            Problem("far_unreachable", ERROR, far_ns, f"{to_address} cannot be read from here: {exc}")
        ], where
    to = Side(far_ns, to_address, far_catalog)
    problems = configuration(frm, from_service, to, to_service, contract, now)
    problems += access(
        frm,
        from_service,
        to_service,
        _access(here, frm, from_service, to if far is here and far_ns == namespace else None, to_service, timeout),
    )
    if far_ns != namespace and not far_catalog.services and not far_catalog.queues:
        problems.append(
            Problem(
                "namespace_empty",
                ERROR,
                far_ns,
                f"{to_address} has no catalog: is the namespace applied (`kbroker apply`)?",
            )
        )
    return problems, where


def _access(here: Cluster, frm: Side, from_service: str, local: Side | None, to_service: str, timeout: float) -> Access:
    """What the authorizer lets this connection's principal do on the dialog's queue topics
    (the target's only when `local`: the same namespace, where SEND writes it directly)."""
    sender, target = frm.catalog.services.get(from_service), local.catalog.services.get(to_service) if local else None
    mine = names.queue_topic(frm.namespace, sender.queue) if sender is not None else None
    theirs = names.queue_topic(frm.namespace, target.queue) if target is not None else None
    seen = authorized(here, [t for t in {mine, theirs} if t is not None], timeout)
    return Access(principal(here), seen.get(theirs) if theirs else None, seen.get(mine) if mine else None)


def diagnose_runtime(
    cluster: ClusterLike, namespace: str, timeout: float = 10.0, stuck_after: float = STUCK_AFTER_S
) -> tuple[list[Problem], dict[str, Any]]:
    """What stops messages in `namespace` now, and what was measured ({"queues": [...],
    "transmission": n, "open_transactions": [...], "analytics_as_of": epoch s or None})."""
    catalog = read_catalog(cluster, namespace, timeout)
    queues = _queue_states(cluster, namespace, catalog.queues.values(), timeout)
    rows = transmission_rows(cluster, namespace, timeout=timeout)
    transactions = open_transactions(cluster, namespace, timeout)
    as_of = newest_analytics(cluster, namespace, timeout)
    measured = {
        "queues": [vars(q) for q in queues],
        "transmission": len(rows),
        "open_transactions": [vars(t) for t in transactions],
        "analytics_as_of": as_of,
    }
    return runtime(namespace, queues, rows, as_of, time.time(), transactions, stuck_after), measured


def diagnose_conversation(
    cluster: ClusterLike, namespace: str, conversation: str, timeout: float = 10.0, stuck_after: float = STUCK_AFTER_S
) -> tuple[list[Problem], dict[str, Any]]:
    """What stops one dialog (`conversation`: an endpoint's handle or the conversation id): its
    endpoints' states and lifetimes, its services' queues, its routed messages not acknowledged;
    and what was measured ({"endpoints": [...], "transmission": [...], "queues": [...]})."""
    catalog = read_catalog(cluster, namespace, timeout)
    eps = [
        ep
        for ep in read_endpoints(cluster, namespace, as_written=True)
        if conversation in (ep.conversation_handle, ep.conversation_id)
    ]
    handles = {ep.conversation_handle for ep in eps}
    services = [catalog.services.get(ep.service_name) for ep in eps]
    wanted = {s.queue for s in services if s is not None}
    queues = _queue_states(cluster, namespace, [q for q in catalog.queues.values() if q.name in wanted], timeout)
    rows = [
        r for r in transmission_rows(cluster, namespace, timeout=timeout) if r.get("conversation_handle") in handles
    ]
    facts = [
        {
            "conversation_handle": ep.conversation_handle,
            "conversation_id": ep.conversation_id,
            "is_initiator": ep.is_initiator,
            "service_name": ep.service_name,
            "far_service": ep.far_service_name,
            "state": ep.state,
            "state_desc": ep.state_desc,
            "lifetime": ep.lifetime,
            "send_sequence": ep.send_sequence,
        }
        for ep in eps
    ]
    measured = {"endpoints": facts, "transmission": rows, "queues": [vars(q) for q in queues]}
    return conversation_problems(namespace, facts, queues, rows, time.time(), stuck_after), measured


def _queue_states(cluster: ClusterLike, namespace: str, queues: Iterable[Queue], timeout: float) -> list[QueueState]:
    """Each queue as measured now (queue_view_of), with its readers' oldest locks and its message
    rolled back most lately; a queue with no topic yet (nothing sent to it) is left out."""
    out = []
    rollbacks = recent_rollbacks(cluster, namespace, timeout)
    for q in sorted(queues, key=lambda q: q.name):
        try:
            view = queue_view_of(cluster, namespace, q, timeout)
        except CatalogError:
            continue
        activation = None if q.activation is None else f"{q.activation.kind} {q.activation.status}"
        locks = tuple(
            (r["process"], r["oldest_lock_at"] / 1000)
            for r in view["readers"]
            if isinstance(r.get("oldest_lock_at"), (int, float))
        )
        out.append(
            QueueState(
                q.name,
                q.status,
                activation,
                int(view["totals"]["ready"]),
                int(view["group"]["members"]),
                locks,
                _still_queued(rollbacks.get(q.name, {}), view["partition_offsets"]),
            )
        )
    return out


def _still_queued(counts: dict[tuple[int, int], int], partitions: list[dict[str, Any]]) -> tuple[str, int] | None:
    """The most rolled-back of `counts` ((partition, offset) -> rollbacks) not received since: at
    or past its partition's committed position (a message completed out of order above it may
    count too: a hint, not a verdict)."""
    committed = {
        row["partition"]: row["committed"] if row["committed"] is not None else row["start"] for row in partitions
    }
    waiting = [(n, p, o) for (p, o), n in counts.items() if p in committed and o >= committed[p]]
    if not waiting:
        return None
    n, p, o = max(waiting)
    return f"{p}:{o}", n


def newest_analytics(cluster: ClusterLike, namespace: str, timeout: float) -> float | None:
    """Epoch seconds of the analytics job's newest figures (its records' `as_of`), None when it
    has written none. Records that are not the job's (anyone may write the topic) are skipped."""
    newest = None
    for value in (latest_values(cluster, names.analytics_topic(namespace), timeout) or {}).values():
        try:
            at = orjson.loads(value).get("as_of") if value else None
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(at, (int, float)) and not isinstance(at, bool) and at > 0:
            newest = max(newest or 0.0, at / 1000)
    return newest
