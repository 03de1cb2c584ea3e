"""The routing scenario: dialogs between namespaces (a Service Broker "database" each) through the
transmitter and the dispatcher, against the same dialogs within one namespace (kbroker's local
path), in the same repetition.

    routing-request-reply-namespaces  round trips/s, requester in namespace A, responder in B, both
                                      on the run's broker
    routing-request-reply-clusters    the same with B on a second Kafka cluster (an embedded broker
                                      the scenario starts and stops)
    routing-transmission-latency      SEND commit in A -> RECEIVE in B, p99 (p50 in the details),
                                      at a light steady load

Each topology gets fresh namespaces whose catalog this module writes (a request/reply contract,
queues CQ and SQ of 4 partitions). Across namespaces each has a route to the other's service
(`kafka://<bootstrap>/<namespace>`) and runs a Dispatcher and a Transmitter in this process, as
`kbroker worker` does (its default 5 s tick, the catalog of the namespace's Broker). The requester
and the responder are the same code in every topology: threads RECEIVE with wait and SEND in one
`broker.transaction()`; only where the far service lives differs."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from kbroker.bench.common import join_all, json_body, need_transactions, percentile
from kbroker.bench.harness import BenchContext, Floor, Row, Scenario, bench_broker, scenario
from kbroker.core.catalog.models import Catalog
from kbroker.core.cluster import Cluster
from kbroker.sdk.broker import Broker

if TYPE_CHECKING:
    from kbroker.kafka.routing.dispatcher import Dispatcher
    from kbroker.kafka.routing.transmitter import Transmitter

REQUEST, REPLY = "//Bench/Routing/Request", "//Bench/Routing/Reply"
CONTRACT = "//Bench/Routing/RequestReply"
CLIENT, SERVER = "//Bench/Routing/Client", "//Bench/Routing/Server"
CLIENT_QUEUE, SERVER_QUEUE = "CQ", "SQ"

DIALOGS = 32  # request-reply: dialogs, one request in flight on each (closed loop)
THREADS = 16  # request-reply: requester threads (in A) and responder threads (in B), each
MEASURE_SECONDS = 15.0  # request-reply: the measured window, after the warm-up
SETTLE_SECONDS = 2.0  # request-reply: running, unmeasured, after every dialog's first reply
LATENCY_DIALOGS = 8
LATENCY_RATE = 25.0  # SENDs per second, one per transaction, round-robin over the dialogs
LATENCY_SECONDS = 12.0
WARM_TIMEOUT = 120.0  # the first replies (consumer groups join, connections open)
TICK = 5.0  # the transmitter's and dispatcher's tick: kbroker worker's default

LOCAL, NAMESPACES, CLUSTERS = "local", "namespaces", "clusters"


# --- the catalogs and the topologies ----------------------------------------------------------


def catalog_yaml(services: list[str], routes: list[tuple[str, str, str]]) -> str:
    """A namespace's definitions: the contract, CQ and SQ, `services` (CLIENT and/or SERVER) and
    `routes` (name, service, address)."""
    svc = {
        CLIENT: f"  - {{name: '{CLIENT}', queue: {CLIENT_QUEUE}}}",
        SERVER: f"  - {{name: '{SERVER}', queue: {SERVER_QUEUE}, contracts: ['{CONTRACT}']}}",
    }
    text = (
        f"""message_types:
  - {{name: '{REQUEST}', validation: JSON}}
  - {{name: '{REPLY}', validation: JSON}}
contracts:
  - name: '{CONTRACT}'
    messages:
      - {{type: '{REQUEST}', sent_by: INITIATOR}}
      - {{type: '{REPLY}', sent_by: TARGET}}
queues:
  - {{name: {CLIENT_QUEUE}, partitions: 4}}
  - {{name: {SERVER_QUEUE}, partitions: 4}}
services:
"""
        + "\n".join(svc[s] for s in services)
        + "\n"
    )
    if routes:
        text += "routes:\n" + "".join(f"  - {{name: {n}, service_name: '{s}', address: '{a}'}}\n" for n, s, a in routes)
    return text


@dataclass
class RoutingState:
    """The second cluster (for CLUSTERS) and where the catalogs are written; `resources` stops
    and removes both."""

    resources: ExitStack
    remote_cluster: Cluster
    yaml_dir: Path


def setup_routing(ctx: BenchContext) -> RoutingState:
    need_transactions(ctx)
    with ExitStack() as stack:
        yaml_dir = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="kbroker-bench-routing-", ignore_cleanup_errors=True)
            )
        )
        remote_cluster, _, _ = stack.enter_context(bench_broker(None, ctx.reporter, "second cluster"))
        return RoutingState(stack.pop_all(), remote_cluster, yaml_dir)


def teardown_routing(_ctx: BenchContext, state: RoutingState | None) -> None:
    if state is not None:
        state.resources.close()


def _apply(ctx: BenchContext, state: RoutingState, cluster: Cluster, ns: str, text: str) -> None:
    from kbroker.kafka.catalog.apply import apply_paths

    path = state.yaml_dir / f"{ns}.yaml"
    path.write_text(text)
    apply_paths(cluster, ns, [path])
    if cluster == ctx.cluster:  # the second cluster is thrown away whole
        ctx.namespaces.append(ns)


@dataclass
class Topology:
    """The requester's Broker (CLIENT's namespace), the responder's (SERVER's; the same namespace
    for LOCAL), and the routing services running for them."""

    kind: str
    requester: Broker
    responder: Broker
    # side ("a": the requester's namespace, "b": the responder's) -> its service; empty for LOCAL
    dispatchers: dict[str, Dispatcher] = field(default_factory=dict)
    transmitters: dict[str, Transmitter] = field(default_factory=dict)

    def counters(self) -> dict[str, int]:
        """What the transmitters and dispatchers did (empty for LOCAL)."""
        out: dict[str, int] = {}
        for side, d in self.dispatchers.items():
            for f in ("saved", "duplicates", "refused", "dropped"):
                out[f"{side}_dispatcher_{f}"] = getattr(d, f)
            t = self.transmitters[side]
            out[f"{side}_transmitter_waiting"] = len(t.queue)
            for f in ("sent", "acked", "refused"):
                out[f"{side}_transmitter_{f}"] = getattr(t, f)
        return out

    def check(self) -> None:
        """A refused message means the topology is wrong, not slow: fail the measurement."""
        for side, d in self.dispatchers.items():
            for what, s in (("dispatcher", d), ("transmitter", self.transmitters[side])):
                if s.refused:
                    raise RuntimeError(f"{what} of {s.namespace} refused {s.refused} message(s)")

    def waiting(self) -> str:
        """What the transmitters hold, for an error message."""
        rows = []
        for t in self.transmitters.values():
            r = t.report()
            statuses = sorted({m.get("transmission_status") or "" for m in r["messages"]} - {""})
            rows.append(
                f"{t.namespace}: {r['waiting']} waiting, sent {r['sent']}, acked {r['acked']}"
                + (f", statuses {statuses}" if statuses else "")
            )
        return "; ".join(rows) or "no transmitter (local)"


def _catalog_of(broker: Broker) -> Callable[[], Catalog]:
    """The namespace's catalog as the Broker last read it (kept current by its catalog watcher),
    what kbroker worker gives its dispatcher and transmitter."""
    return lambda: broker.catalog


@contextmanager
def topology(ctx: BenchContext, state: RoutingState, kind: str, tag: str) -> Iterator[Topology]:
    """Fresh namespaces for `kind`: LOCAL (CLIENT and SERVER in one namespace), NAMESPACES (A and
    B on the run's broker) or CLUSTERS (B on the second cluster)."""
    from kbroker.kafka.routing.dispatcher import Dispatcher
    from kbroker.kafka.routing.transmitter import Transmitter

    suffix = uuid.uuid4().hex[:8]
    with ExitStack() as stack:
        if kind == LOCAL:
            ns = f"bench-{tag}-l-{suffix}"
            _apply(ctx, state, ctx.cluster, ns, catalog_yaml([CLIENT, SERVER], []))
            req = stack.enter_context(Broker(ctx.cluster, ns))
            resp = stack.enter_context(Broker(ctx.cluster, ns))
            yield Topology(kind, req, resp)
            return
        a, b = f"bench-{tag}-a-{suffix}", f"bench-{tag}-b-{suffix}"
        a_cluster = ctx.cluster
        b_cluster = ctx.cluster if kind == NAMESPACES else state.remote_cluster
        _apply(
            ctx,
            state,
            a_cluster,
            a,
            catalog_yaml([CLIENT], [("ToServer", SERVER, f"kafka://{b_cluster.bootstrap}/{b}")]),
        )
        _apply(
            ctx,
            state,
            b_cluster,
            b,
            catalog_yaml([SERVER], [("ToClient", CLIENT, f"kafka://{a_cluster.bootstrap}/{a}")]),
        )
        req = stack.enter_context(Broker(a_cluster, a))
        resp = stack.enter_context(Broker(b_cluster, b))
        topo = Topology(kind, req, resp)
        for side, cluster, ns, br in (("a", a_cluster, a, req), ("b", b_cluster, b, resp)):
            topo.dispatchers[side] = stack.enter_context(Dispatcher(cluster, ns, _catalog_of(br), tick=TICK))
            topo.transmitters[side] = stack.enter_context(Transmitter(cluster, ns, _catalog_of(br), tick=TICK))
        yield topo


# --- request-reply ------------------------------------------------------------------------------


@dataclass
class RoundTrips:
    """Replies the requesters committed, and the round trip of each measured one."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent_at: dict[str, float] = field(default_factory=dict)  # handle -> its request's SEND
    replied: set[str] = field(default_factory=set)  # dialogs with at least one reply
    replies: int = 0
    measuring: bool = False
    rtts: list[float] = field(default_factory=list)


def _raise_first(errors: list[BaseException]) -> None:
    if errors:
        raise errors[0]


def _wait_until(
    topo: Topology, errors: list[BaseException], timeout: float, interval: float, shortfall: Callable[[], str | None]
) -> None:
    """Poll every `interval` s until shortfall() is None; raises the threads' first error, a
    refusal (topo.check()), or, after `timeout` s, "<kind>: <shortfall> after <timeout> s (what the
    transmitters hold)"."""
    deadline = time.monotonic() + timeout
    while True:
        _raise_first(errors)
        topo.check()
        missing = shortfall()
        if missing is None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topo.kind}: {missing} after {timeout:.0f} s ({topo.waiting()})")
        time.sleep(interval)


def round_trips(ctx: BenchContext, topo: Topology) -> dict[str, Any]:
    """Round trips per second over DIALOGS dialogs, one request in flight on each: THREADS
    requester threads RECEIVE replies in CLIENT's queue and SEND the next request in the same
    transaction, THREADS responder threads RECEIVE requests in SERVER's and SEND the reply."""
    body_bytes = ctx.params.body_bytes
    request_body, reply_body = json_body(body_bytes, req=1), json_body(body_bytes, ok=True)
    stats, stop, errors = RoundTrips(), threading.Event(), list[BaseException]()

    def respond() -> None:
        try:
            while not stop.is_set():
                with topo.responder.transaction() as tx:
                    for m in tx.receive(SERVER_QUEUE, top=100, wait=0.5):
                        if m.message_type_name != REQUEST:
                            raise RuntimeError(f"responder got {m.message_type_name}: {m.body[:300]!r}")
                        tx.send(m.conversation_handle, REPLY, reply_body)
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()

    def request() -> None:
        try:
            while not stop.is_set():
                done: list[tuple[str, float | None]] = []
                with topo.requester.transaction() as tx:
                    msgs = tx.receive(CLIENT_QUEUE, top=100, wait=0.5)
                    now = time.perf_counter()
                    for m in msgs:
                        if m.message_type_name != REPLY:
                            raise RuntimeError(f"requester got {m.message_type_name}: {m.body[:300]!r}")
                        h = m.conversation_handle
                        with stats.lock:
                            sent = stats.sent_at.get(h)
                            # Before the commit: the reply to it cannot arrive earlier.
                            stats.sent_at[h] = now
                        done.append((h, None if sent is None else now - sent))
                        tx.send(h, REQUEST, request_body)
                if done:  # committed
                    with stats.lock:
                        for h, rtt in done:
                            stats.replied.add(h)
                            stats.replies += 1
                            if stats.measuring and rtt is not None:
                                stats.rtts.append(rtt * 1000)
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()

    def unreplied() -> str | None:
        with stats.lock:
            warmed = len(stats.replied)
        return None if warmed >= DIALOGS else f"{warmed} of {DIALOGS} dialogs had a reply"

    threads = [threading.Thread(target=respond, name=f"routing-responder-{i}", daemon=True) for i in range(THREADS)]
    threads += [threading.Thread(target=request, name=f"routing-requester-{i}", daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    try:
        ctx.say(f"{topo.kind}: {DIALOGS} dialogs, first requests")
        t_begin = time.perf_counter()
        for _ in range(DIALOGS):
            with topo.requester.transaction() as tx:
                h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
                with stats.lock:
                    stats.sent_at[h] = time.perf_counter()
                tx.send(h, REQUEST, request_body)
        _wait_until(topo, errors, WARM_TIMEOUT, 0.1, unreplied)
        first_replies = time.perf_counter() - t_begin
        time.sleep(SETTLE_SECONDS)
        _raise_first(errors)
        with stats.lock:
            stats.measuring = True
            c0, t0 = stats.replies, time.perf_counter()
        with ctx.reporter.bar(f"{topo.kind} request-reply (s)", int(MEASURE_SECONDS)) as advance:
            shown = 0
            while (elapsed := time.perf_counter() - t0) < MEASURE_SECONDS:
                _raise_first(errors)
                time.sleep(min(0.25, MEASURE_SECONDS - elapsed))
                now_shown = min(int(time.perf_counter() - t0), int(MEASURE_SECONDS))
                advance(now_shown - shown)
                shown = now_shown
        with stats.lock:
            c1, t1 = stats.replies, time.perf_counter()
            stats.measuring = False
            rtts = sorted(stats.rtts)
        _raise_first(errors)
        topo.check()
        counters = topo.counters()
    finally:
        stop.set()
        if not join_all(threads, 30):
            ctx.say(f"[yellow]{topo.kind}: requester/responder threads did not stop[/yellow]")
    if c1 == c0:
        raise RuntimeError(f"{topo.kind}: no reply in {MEASURE_SECONDS:.0f} s of measuring ({topo.waiting()})")
    return {
        "value": (c1 - c0) / (t1 - t0),
        "detail": {
            "round_trips": c1 - c0,
            "seconds": t1 - t0,
            "rtt_p50_ms": percentile(rtts, 50),
            "rtt_p99_ms": percentile(rtts, 99),
            "first_replies_s": first_replies,
            **counters,
        },
    }


# --- transmission latency -----------------------------------------------------------------------


def transmission_latency(ctx: BenchContext, topo: Topology) -> dict[str, Any]:
    """SEND commit in A (the transaction's commit returned) -> a RECEIVE in B returning the
    message, per message, at LATENCY_RATE SENDs a second (one per transaction) over
    LATENCY_DIALOGS dialogs; a warm-up message per dialog first."""
    stop, errors = threading.Event(), list[BaseException]()
    received: dict[int, float] = {}
    lock = threading.Lock()

    def receive() -> None:
        try:
            while not stop.is_set():
                for m in topo.responder.receive(SERVER_QUEUE, top=100, wait=0.5):
                    t = time.perf_counter()
                    n = orjson.loads(m.body)["n"]
                    with lock:
                        if n in received:
                            raise RuntimeError(f"{topo.kind}: message {n} received twice")
                        received[n] = t
        except BaseException as exc:  # noqa: BLE001 - raised again on the scenario's main thread
            errors.append(exc)
            stop.set()

    def body(n: int) -> bytes:
        return json_body(ctx.params.body_bytes, n=n)

    def wait_received(ns: range, timeout: float, what: str) -> None:
        def unreceived() -> str | None:
            with lock:
                missing = [n for n in ns if n not in received]
            return f"{len(missing)} of {len(ns)} {what} not received" if missing else None

        _wait_until(topo, errors, timeout, 0.05, unreceived)

    receiver = threading.Thread(target=receive, name="routing-latency-receiver", daemon=True)
    receiver.start()
    committed: dict[int, float] = {}
    try:
        handles = []
        for i in range(LATENCY_DIALOGS):  # warm-up: -1, -2, ...
            with topo.requester.transaction() as tx:
                h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
                tx.send(h, REQUEST, body(-1 - i))
            handles.append(h)
        wait_received(range(-LATENCY_DIALOGS, 0), WARM_TIMEOUT, "warm-up messages")
        total = int(LATENCY_RATE * LATENCY_SECONDS)
        with ctx.reporter.bar(f"{topo.kind} SEND -> RECEIVE", total) as advance:
            start = time.perf_counter()
            for n in range(total):
                _raise_first(errors)
                pause = start + n / LATENCY_RATE - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                with topo.requester.transaction() as tx:
                    tx.send(handles[n % LATENCY_DIALOGS], REQUEST, body(n))
                committed[n] = time.perf_counter()
                advance(1)
            sending = time.perf_counter() - start
        wait_received(range(total), 60, "messages")
        time.sleep(0.5)  # a late duplicate would show here
        _raise_first(errors)
        counters = topo.counters()
    finally:
        stop.set()
        if not join_all([receiver], 30):
            ctx.say(f"[yellow]{topo.kind}: the receiver thread did not stop[/yellow]")
    lat = sorted((received[n] - committed[n]) * 1000 for n in range(total))
    return {
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1],
        "min_ms": lat[0],
        "messages": total,
        "send_rate": total / sending,
        **counters,
    }


# --- the scenario -------------------------------------------------------------------------------


def run_routing(ctx: BenchContext, state: RoutingState, rep: int) -> dict[str, dict]:
    """Every topology measured in this repetition, the order reversed every other repetition."""
    kinds = [LOCAL, NAMESPACES, CLUSTERS]
    if rep % 2:
        kinds.reverse()
    rr: dict[str, dict] = {}
    for kind in kinds:
        with topology(ctx, state, kind, "rr") as topo:
            rr[kind] = round_trips(ctx, topo)
        ctx.say(f"{kind}: {rr[kind]['value']:,.1f} round trips/s")
    lat: dict[str, dict] = {}
    for kind in kinds:
        with topology(ctx, state, kind, "lat") as topo:
            lat[kind] = transmission_latency(ctx, topo)
        ctx.say(f"{kind}: SEND -> RECEIVE p50 {lat[kind]['p50_ms']:.1f} ms, p99 {lat[kind]['p99_ms']:.1f} ms")
    local = rr[LOCAL]

    def pair(kind: str) -> dict[str, Any]:
        return {
            "kbroker": rr[kind]["value"],
            "baseline": local["value"],
            "kbroker_detail": rr[kind]["detail"],
            "baseline_detail": local["detail"],
        }

    clusters = lat[CLUSTERS]
    return {
        "routing-request-reply-namespaces": pair(NAMESPACES),
        "routing-request-reply-clusters": pair(CLUSTERS),
        "routing-transmission-latency": {
            "kbroker": lat[NAMESPACES]["p99_ms"],
            "baseline": lat[LOCAL]["p99_ms"],
            "kbroker_detail": {
                **lat[NAMESPACES],
                "clusters_p50_ms": clusters["p50_ms"],
                "clusters_p99_ms": clusters["p99_ms"],
            },
            "baseline_detail": lat[LOCAL],
        },
    }


def _rr_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    if k or b:
        out["summary"] = (
            f"round trip p50/p99 ms: routed {k.get('rtt_p50_ms')}/{k.get('rtt_p99_ms')}, "
            f"local {b.get('rtt_p50_ms')}/{b.get('rtt_p99_ms')}"
        )


def _latency_summary(out: dict) -> None:
    k, b = out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}
    out["latency_ms"] = {
        "kbroker": {"p50": k.get("p50_ms"), "p99": k.get("p99_ms")},
        "baseline": {"p50": b.get("p50_ms"), "p99": b.get("p99_ms")},
        "clusters": {"p50": k.get("clusters_p50_ms"), "p99": k.get("clusters_p99_ms")},
    }
    if k or b:
        out["summary"] = (
            f"p50/p99 ms: across namespaces {k.get('p50_ms')}/{k.get('p99_ms')}, "
            f"within one {b.get('p50_ms')}/{b.get('p99_ms')}, across clusters "
            f"{k.get('clusters_p50_ms')}/{k.get('clusters_p99_ms')}"
        )


_RR_NOTES = (
    f"closed loop over {DIALOGS} dialogs, one request in flight on each; {THREADS} requester threads "
    f"(RECEIVE the reply + SEND the next request in one broker.transaction(), wait 0.5 s) and {THREADS} "
    f"responder threads (RECEIVE + SEND the reply in one transaction), {MEASURE_SECONDS:.0f} s measured "
    "after every dialog's first reply and 2 s more. kbroker: requester in namespace A, responder in B, a "
    f"Dispatcher and a Transmitter per namespace ({TICK:g} s tick, as kbroker worker). Baseline: the same "
    "code with both services in ONE namespace (the local path), measured once per repetition for both "
    "routing rows"
)

_RR_BASELINE = 'kbroker/bench/scenarios/routing.py:round_trips (topology "local")'

scenario(
    Scenario(
        name="routing",
        description="dialogs between namespaces and clusters (transmitter/dispatcher) against one namespace",
        rows=(
            Row(
                "routing-request-reply-namespaces",
                "round trips/s",
                None,
                baseline_code=_RR_BASELINE,
                notes=_RR_NOTES + "; A and B on the same cluster; informational, no target",
                finish=_rr_summary,
            ),
            Row(
                "routing-request-reply-clusters",
                "round trips/s",
                "ratio >= 0.5",
                check=lambda r: r["ratio"] >= 0.5,
                floor=Floor(0.25),
                baseline_code=_RR_BASELINE,
                notes=_RR_NOTES + "; B on a second Kafka cluster (an embedded broker started for the scenario)",
                finish=_rr_summary,
            ),
            Row(
                "routing-transmission-latency",
                "ms (p99)",
                None,
                baseline_code='kbroker/bench/scenarios/routing.py:transmission_latency (topology "local")',
                notes=f"SEND's transaction commit returned in A -> a RECEIVE (wait 0.5 s) in B returned the message, "
                f"{LATENCY_RATE:g} SENDs/s (one per transaction) over {LATENCY_DIALOGS} dialogs for "
                f"{LATENCY_SECONDS:g} s; kbroker: A and B on one cluster (p50 and the cross-cluster p50/p99 in "
                "the details); baseline: the same within one namespace; ratio kbroker/baseline (above 1: "
                "routing adds latency); no target",
                finish=_latency_summary,
            ),
        ),
        run=run_routing,
        setup=setup_routing,
        teardown=teardown_routing,
        not_quick="it starts a second embedded broker and measures three topologies over fixed windows "
        f"({MEASURE_SECONDS:g} s of round trips and {LATENCY_SECONDS:g} s of SENDs each): about 2 minutes alone",
    )
)
