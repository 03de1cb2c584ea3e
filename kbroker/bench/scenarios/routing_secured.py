"""The secured routing scenario: the routing scenario's request-reply between two namespaces on
the run's broker, with dialog security (full: the session key wrapped for the far service's
certificate and signed by the initiator's, every body sealed with AES-256-GCM) against the same
dialogs in clear, in the same repetition.

    routing-secured-round-trips   round trips/s secured / in clear (target >= 0.8)

Each side's certificates are made for the repetition in a temporary keys directory of its own,
and A's catalog gains a remote service binding for B's service; otherwise the topology, the
requester and responder threads and the measured window are routing.py's."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from kbroker.bench.common import need_transactions
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, scenario
from kbroker.bench.scenarios.routing import (
    CLIENT,
    NAMESPACES,
    SERVER,
    TICK,
    RoutingState,
    Topology,
    _apply,
    _catalog_of,
    catalog_yaml,
    round_trips,
)
from kbroker.sdk.broker import Broker

BINDING = "remote_service_bindings:\n  - {name: ToServer, to_service: '%s', user: server_user}\n" % SERVER


def setup_secured(ctx: BenchContext) -> RoutingState:
    need_transactions(ctx)
    with ExitStack() as stack:
        yaml_dir = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="kbroker-bench-secured-", ignore_cleanup_errors=True)
            )
        )
        return RoutingState(stack.pop_all(), ctx.cluster, yaml_dir)


def teardown_secured(_ctx: BenchContext, state: RoutingState | None) -> None:
    if state is not None:
        state.resources.close()


@contextmanager
def secured_topology(ctx: BenchContext, state: RoutingState, secured: bool) -> Iterator[Topology]:
    """Namespaces A (CLIENT) and B (SERVER) on the run's broker, each with a dispatcher and a
    transmitter; `secured`: certificates on both sides and A's binding for SERVER."""
    from kbroker.kafka.routing.dispatcher import Dispatcher
    from kbroker.kafka.routing.transmitter import Transmitter
    from kbroker.kafka.security.certificates import CertificateStore

    suffix = uuid.uuid4().hex[:8]
    tag = "sec" if secured else "clr"
    a, b = f"bench-{tag}-a-{suffix}", f"bench-{tag}-b-{suffix}"
    boot = ctx.cluster.bootstrap
    stores = {
        "a": CertificateStore(state.yaml_dir / f"{a}-certs"),
        "b": CertificateStore(state.yaml_dir / f"{b}-certs"),
    }
    if secured:
        stores["b"].create("ServerCert", "dbo", "Server")
        stores["a"].create("ClientCert", "dbo", "Client")
        stores["a"].import_("ServerCert", "server_user", stores["b"].export("ServerCert"))
        stores["b"].import_("ClientCert", "client_user", stores["a"].export("ClientCert"))
    a_yaml = catalog_yaml([CLIENT], [("ToServer", SERVER, f"kafka://{boot}/{b}")]) + (BINDING if secured else "")
    _apply(ctx, state, ctx.cluster, a, a_yaml)
    _apply(ctx, state, ctx.cluster, b, catalog_yaml([SERVER], [("ToClient", CLIENT, f"kafka://{boot}/{a}")]))
    with ExitStack() as stack:
        req = stack.enter_context(Broker(ctx.cluster, a))
        resp = stack.enter_context(Broker(ctx.cluster, b))
        topo = Topology(NAMESPACES, req, resp)
        for side, ns, br in (("a", a, req), ("b", b, resp)):
            topo.dispatchers[side] = stack.enter_context(
                Dispatcher(ctx.cluster, ns, _catalog_of(br), tick=TICK, certificates=stores[side])
            )
            topo.transmitters[side] = stack.enter_context(
                Transmitter(ctx.cluster, ns, _catalog_of(br), tick=TICK, certificates=stores[side])
            )
        yield topo


def run_secured(ctx: BenchContext, state: RoutingState, rep: int) -> dict[str, dict]:
    """Secured and clear, the order reversed every other repetition."""
    out: dict[bool, dict[str, Any]] = {}
    for secured in (True, False) if rep % 2 == 0 else (False, True):
        with secured_topology(ctx, state, secured) as topo:
            out[secured] = round_trips(ctx, topo)
            if secured:
                held = [m.get("security") for t in topo.transmitters.values() for m in t.report()["messages"]]
                out[secured]["detail"]["security_of_held"] = sorted({str(s) for s in held if s})
        ctx.say(f"{'secured' if secured else 'clear'}: {out[secured]['value']:,.1f} round trips/s")
    return {
        "routing-secured-round-trips": {
            "kbroker": out[True]["value"],
            "baseline": out[False]["value"],
            "kbroker_detail": out[True]["detail"],
            "baseline_detail": out[False]["detail"],
        }
    }


def _summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    if k or b:
        out["summary"] = (
            f"round trip p50/p99 ms: secured {k.get('rtt_p50_ms')}/{k.get('rtt_p99_ms')}, "
            f"clear {b.get('rtt_p50_ms')}/{b.get('rtt_p99_ms')}"
        )


scenario(
    Scenario(
        name="routing-secured",
        description="routed request-reply with full dialog security against the same in clear",
        rows=(
            Row(
                "routing-secured-round-trips",
                "round trips/s",
                "ratio >= 0.8",
                check=lambda r: r["ratio"] >= 0.8,
                floor=Floor(0.4),
                baseline_code="kbroker/bench/scenarios/routing.py:round_trips (namespaces A and B, no binding)",
                notes="routing.py's request-reply (closed loop over its dialogs, requester in namespace A, "
                "responder in B on the run's broker, a Dispatcher and a Transmitter per namespace); kbroker: "
                "full dialog security (certificates each side, A's remote service binding for B's service); "
                "baseline: the same code and topology in clear",
                finish=_summary,
            ),
        ),
        run=run_secured,
        setup=setup_secured,
        teardown=teardown_secured,
        not_quick="two routed topologies over routing.py's fixed windows: about a minute alone",
    )
)
