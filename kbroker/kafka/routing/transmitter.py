"""The transmitter: sends the namespace's transmission topic to other namespaces, each message
over its destination's connection, until the far dispatcher acknowledged it.

What to send when (retries at 4, 8, 16, 32 s, then every 64 s) and how far the topic may be
committed is core/routing/transmission.py's; when to connect, suppress and close connections is
core/routing/links.py's; which route a message takes is core/routing/routes.py's. This module reads, sends,
polls acknowledgements and publishes what it holds (kbroker transmission, kbroker connections);
what it tells its own namespace (notices, events, Errors, records set aside) is notices.py's.
Run one or more per cluster (each worker runs one): they share the topic's partitions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from kbroker import metrics
from kbroker.core import names
from kbroker.core.activation.tick import EVERY_2ND, EVERY_5TH, TickCounter, TickSchedule, advance
from kbroker.core.catalog.models import Catalog, Route
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.records import Header
from kbroker.core.routing.links import IDLE_CLOSE
from kbroker.core.routing.routes import address, hop, is_expired, match_route, routes_of
from kbroker.core.routing.signing import sign
from kbroker.core.routing.transmission import STALL_AFTER, Outgoing, Refusal, TransmissionQueue
from kbroker.core.security.dialog_security import SealRefused
from kbroker.kafka import clients, messages
from kbroker.kafka.routing.keys import Keys, key_id
from kbroker.kafka.routing.link import LinkBroken
from kbroker.kafka.routing.link_pool import LinkPool
from kbroker.kafka.routing.notices import Notices
from kbroker.kafka.routing.sealing import Sealer, TransmissionSeal
from kbroker.kafka.routing.views import ReportWriter, outgoing
from kbroker.kafka.security.certificates import CertificateError, CertificateStore
from kbroker.kafka.steps import FailureSink, run_steps

log = logging.getLogger("kbroker.transmitter")
COMPONENT = "transmitter"
WAIT_RETRY = 4.0  # a message with no route or connection is looked at again this often
MAX_WAITING = 20_000  # messages held before the transmission topic is paused (back-pressure)
MAX_WAITING_BYTES = 64 * 1024 * 1024
REPORT_ROWS = 200  # messages a report lists (the view says how many more wait)


class Transmitter:
    """`catalog()` gives the namespace's current catalog (routes, services)."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        catalog: Callable[[], Catalog],
        *,
        guard: FailureSink | None = None,
        tick: float = 5.0,
        poll_interval: float = 0.05,
        idle_close: float = IDLE_CLOSE,
        stall_after: float = STALL_AFTER,
        keys: Keys | None = None,
        certificates: CertificateStore | None = None,
    ):
        """`keys`: where the namespace's master key is (config.keys_dir() by default; made there
        when there is none); an unreadable one stops the transmitter from starting.
        `certificates`: the services' certificates (dialog security; config.keys_dir() too)."""
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        keys = keys or Keys()
        keys.private(namespace)  # read (or made) now: an unreadable key stops the start
        # Read again per record (cached per file version): a rotated key signs from the next one.
        self.sealer = Sealer(namespace, lambda: _current(keys, namespace), certificates or CertificateStore())
        self.transmission_seal = TransmissionSeal(namespace, keys)  # what SEND sealed, opened here
        self._catalog = catalog
        self._guard = guard
        self._poll = poll_interval
        self._stall_after = stall_after
        self.schedule = TickSchedule(interval=tick)
        self.topic = names.transmission_topic(namespace)
        self.queue = TransmissionQueue(namespace)
        self.pool = LinkPool(
            namespace,
            self.cluster,
            idle_close=idle_close,
            signer=lambda key, value, headers: sign(keys.private(namespace), key, value, headers, time.time()),
            on_invalid=lambda msg, why: self._notices.keep(msg, f"invalid acknowledgement: {why}"),
        )
        self.links = self.pool.links
        self.here = address(self.cluster.bootstrap, namespace)  # where LOCAL routes lead
        self._consumer = clients.consumer(
            cluster,
            names.transmitter_group(namespace),
            **{"session.timeout.ms": 10_000, "auto.offset.reset": "earliest"},
        )
        self._reading_refused = clients.reading_refused(
            self.cluster,
            "the transmitter reading the transmission queue",
            self.topic,
            names.transmitter_group(namespace),
        )
        self._local = clients.idempotent_producer(cluster)  # Errors for refused dialogs, reports
        self._notices = Notices(self._local, namespace, COMPONENT)
        # The connections' times move on every look: a report is new when the rest changed.
        self._reports = ReportWriter(self._local, namespace, "transmitter", volatile=("at", "connections"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.denied: BaseException | None = None  # the authorizer's refusal that stopped it
        self._paused = False
        self._ticks = TickCounter()
        self._committed: dict[int, int] = {}
        self._routes_seen: Any = None
        self.sent = self.acked = self.refused = 0
        # Per destination: (messages held, the oldest's age), and each link's state, as of the
        # last 2nd tick; replaced whole, so another thread (the metrics) reads one consistent copy.
        self.backlog: dict[str, tuple[int, float]] = {}
        self.link_states: dict[str, str] = {}
        self._reclassify_asked: str | None = None
        self._wanted: set[str] = set()  # destinations messages wait to connect to
        self._security_logged: set[str] = set()  # certificate problems, each logged once

    def request_reclassify(self, why: str) -> None:
        """From another thread (the worker's control reader): reclassify at the next pass."""
        self._reclassify_asked = why

    def start(self) -> "Transmitter":
        self._consumer.subscribe([self.topic], on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._notices.notice(time.time(), "namespace started")
        self._thread = threading.Thread(target=self._run, name="kbroker-transmitter", daemon=True)
        self._thread.start()
        return self

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit()
        self.queue.drop_partitions(p.partition for p in partitions)
        for p in partitions:
            self._committed.pop(p.partition, None)
        self._paused = False

    def _run(self) -> None:
        self.denied = run_steps(self.step, self._stop, COMPONENT, self._guard, log)

    # --- one pass ----------------------------------------------------------------------------

    def step(self) -> None:
        self._read()
        now = time.time()
        self._ticks, run = advance(self._ticks, now, self.schedule)
        due = run.due if run is not None else frozenset()
        if EVERY_2ND in due:
            self._maintain(now)
            self._connect_pass(now)
            self.backlog = self.queue.backlog(now)
            self.link_states = {row["destination"]: row["state"] for row in self.links.rows(now)}
        why, self._reclassify_asked = self._reclassify_asked, None
        if why is not None:
            self.reclassify(now, why)
        self._send(now)
        self._poll_links(now)
        for m in self.queue.stalled(now, self._stall_after):  # once per message
            self._notices.stalled(m, now)
        if EVERY_5TH in due:
            self._close_idle(now)
        self._commit()
        self._reports.publish(now, lambda: self.report(now))

    def _read(self) -> None:
        full = len(self.queue) >= MAX_WAITING or self.queue.bytes >= MAX_WAITING_BYTES
        assignment = self._consumer.assignment()
        if full != self._paused and assignment:
            (self._consumer.pause if full else self._consumer.resume)(assignment)
            self._paused = full
        batch = clients.consume_soon(self._consumer, 500, 0 if full else self._poll)
        for msg in messages.records(
            batch,
            lambda err: log.warning("transmission topic: %s", err),
            transient=False,
            refused=self._reading_refused,
        ):
            m = outgoing(msg, lambda why: self._notices.keep(msg, why))  # noqa: B023 - called now
            if m is None:
                self.queue.skip(*messages.position(msg))
            else:
                refusal = self.queue.add(m)
                if refusal is not None:
                    self._refuse(refusal)

    def _route(self, m: Outgoing, routes: list[Route], now: float) -> tuple[str, bool]:
        """(`<bootstrap>/<namespace>` of `m`'s next hop, True) or (why it has none, False)."""
        route = match_route(routes, m.to_service, m.to_broker, now)
        if route is None:
            self._notices.notice(now, "route missing", m.to_service, m.to_broker)
            return f"The route to target service '{m.to_service}' was not found.", False
        nxt = hop(route, m.to_service, self.here)
        if nxt is None:
            return f"Route '{route.name}' gives no address for service '{m.to_service}'.", False
        if route.profile:
            self.pool.profile_of[nxt] = route.profile
        return nxt, True

    def _send(self, now: float) -> None:
        catalog = self._catalog()
        due = self.queue.due(now, catalog.honor_broker_priority)
        if not due:
            return
        routes = routes_of(catalog)
        hops: dict[tuple[str, str | None], tuple[str, bool]] = {}  # one route look-up per service a pass
        for m in due:
            where = hops.get((m.to_service, m.to_broker))
            if where is None:
                where = hops[(m.to_service, m.to_broker)] = self._route(m, routes, now)
            dest, routed = where
            if not routed:
                self.queue.waiting(m, now, dest, WAIT_RETRY)
                continue
            link = self.pool.get(dest, now, second_tick=False)
            if isinstance(link, str):
                self._wanted.add(dest)
                self.queue.waiting(m, now, link, WAIT_RETRY, destination=dest)
                continue
            sealed = self._seal(m, catalog)
            if isinstance(sealed, str):
                self.queue.waiting(m, now, sealed, WAIT_RETRY, destination=dest)
                continue
            try:
                link.send(m, self.queue.follows(m), sealed)
            except LinkBroken as exc:
                self.pool.broken(link, now, str(exc))
                self._wanted.add(dest)
                self.queue.waiting(m, now, f"Connection to {dest} broke: {exc}", WAIT_RETRY, destination=dest)
                continue
            self.queue.sent(m, now, dest)
            self.links.active(dest, now, sends=1, size=m.size)
            self.sent += 1
            metrics.of(metrics.TRANSMISSIONS, self.namespace, dest, "sent").inc()

    def _seal(self, m: Outgoing, catalog: Catalog) -> tuple[bytes | None, list[Header]] | str:
        """`m`'s record as its dialog's security sends it, or why it waits (its status)."""
        try:
            value, headers = self.transmission_seal.open(m.record[0], list(m.record[1] or ()))
        except SealRefused as exc:
            return f"Dialog security is unavailable for this conversation: {exc.reason}"
        try:
            sealed = self.sealer.seal(value, list(headers or ()), catalog)
        except CertificateError as exc:  # a private key unreadable or readable by others
            if str(exc) not in self._security_logged:
                self._security_logged.add(str(exc))
                log.warning("transmitter: %s", exc)
            return f"Dialog security is unavailable for this conversation: {exc}"
        if isinstance(sealed, str):
            return sealed
        m.security = sealed[2].value
        return sealed[0], sealed[1]

    def _connect_pass(self, now: float) -> None:
        """Every 2nd tick: connect to the destinations messages wait for, unless suppressed; the
        messages of one that connects go out in this pass."""
        for dest in sorted(self._wanted):
            if isinstance(self.pool.get(dest, now, second_tick=True), str):
                continue
            self._wanted.discard(dest)
            self.queue.wake(now, lambda m: m.destination == dest)  # noqa: B023 - called now

    def _poll_links(self, now: float) -> None:
        for link, acks in self.pool.poll(now):
            before = len(self.queue)
            for key, ack in acks:
                error = ack.get("error")
                refusal = self.queue.acknowledge(
                    key,
                    int(ack.get("next", 0)),
                    None if not error else (int(error.get("code", 0)), str(error.get("description", ""))),
                )
                if ack.get("status"):
                    self.queue.note_status(key, str(ack["status"]))
                if refusal is not None:
                    self._refuse(refusal)
            if acks:
                acknowledged = max(0, before - len(self.queue))
                self.acked += acknowledged
                metrics.of(metrics.TRANSMISSIONS, self.namespace, link.destination, "acknowledged").inc(acknowledged)
                self.links.active(link.destination, now, acks=len(acks))

    def _refuse(self, refusal: Refusal) -> None:
        """The far side refused a dialog: its Error goes to this side's queue (notices.py), and
        the dialog's waiting messages are dropped."""
        if not refusal.dropped:
            return
        self.refused += len(refusal.dropped)
        m = refusal.dropped[0]
        metrics.of(metrics.TRANSMISSIONS, self.namespace, m.destination or "", "refused").inc(len(refusal.dropped))
        service = self._catalog().services.get(m.from_service)
        if service is not None:
            self._notices.refused(m, refusal, service.queue)

    # --- 2nd and 5th tick --------------------------------------------------------------------

    def _maintain(self, now: float) -> None:
        """Every 2nd tick: reclassify when the routes changed or one expired (every waiting
        message is looked at again now), and forget acknowledgements nothing waits for and
        notices older than a minute."""
        routes = routes_of(self._catalog())
        seen = (
            tuple(sorted(r.model_dump_json() for r in routes)),
            tuple(sorted(r.name for r in routes if is_expired(r, now))),
        )
        if seen != self._routes_seen:
            if self._routes_seen is not None:
                self.reclassify(now, "routes changed")
            self._routes_seen = seen
        self.queue.forget()
        self._notices.forget(now)

    def reclassify(self, now: float, why: str) -> None:
        """Look at every waiting message again now (a route or the catalog changed, a command)."""
        count = self.queue.wake(now, lambda m: bool(m.status))
        if count:
            log.info("transmitter reclassified %d waiting message(s): %s", count, why)

    def _close_idle(self, now: float) -> None:
        self.pool.close_idle(now, {m.destination for m in self.queue.held() if m.destination})

    # --- the topic's head and the report -----------------------------------------------------

    def _commit(self) -> None:
        offsets = {p: o for p, o in self.queue.commit_offsets().items() if self._committed.get(p) != o}
        if not offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()], asynchronous=True
            )
            self._committed.update(offsets)
        except Exception as exc:  # noqa: BLE001 - the next pass commits again
            log.debug("transmitter commit: %s", exc)

    def report(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "at": now,
            "messages": self.queue.rows(REPORT_ROWS),
            "connections": self.links.rows(now),
            "waiting": len(self.queue),
            "read_to": {str(p): o for p, o in self.queue.read_positions().items()},
            "sent": self.sent,
            "acked": self.acked,
            "refused": self.refused,
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        self._commit()
        self.pool.close()
        self._reports.close()
        self._local.flush(2)
        self._consumer.close()

    def __enter__(self) -> "Transmitter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _current(keys: Keys, namespace: str) -> tuple[str, bytes]:
    """The id and secret of the namespace's current master key."""
    secret = keys.secret(namespace)
    assert secret is not None  # the current key is always here (made when missing)
    return key_id(keys.private(namespace).public_key()), secret
