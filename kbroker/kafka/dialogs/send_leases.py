"""The conversation leases this process holds (core/dialogs/send_lease.py): claimed on the endpoints
topic before a statement uses a dialog side another process may have used, renewed while in
use, released when idle so other processes wait at most about IDLE_RELEASE for an idle holder.

Claiming is a compare-and-set made of a log: write the claim, read the topic until the lease's
epoch reaches the claim's, and hold it only if the accepted record is this one. Taking over a
lease that ran out fences the old holder's transactional ids first, so nothing it still had
open commits after this process's SENDs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Producer

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.locks import ConversationLocks
from kbroker.core.dialogs.send_lease import (
    IDLE_RELEASE,
    YIELD_BACKOFF,
    SendLease,
    Want,
    first_claim,
    lease_key,
    want_key,
)
from kbroker.core.dialogs.send_sequence import claim_start
from kbroker.errors import BrokerUnavailableError, ConversationLockTimeoutError
from kbroker.kafka.background import Background
from kbroker.kafka.clients import idempotent_producer
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
from kbroker.kafka.producer_failures import Deliveries
from kbroker.kafka.txn.fencing import fence

log = logging.getLogger("kbroker.leases")

POLL = 0.02  # seconds between reads while a claim's answer or a held lease is awaited
KEEP_EVERY = 0.25  # seconds between the keeper's looks at the held leases


class SendLeases(Background):
    thread_name = "kbroker-leases"

    def __init__(
        self,
        cluster: ClusterLike,
        store: EndpointStore,
        locks: ConversationLocks,
        process: str,
        fence_ids: Callable[[], tuple[str, ...]],
        *,
        ack_timeout: float = 30.0,
    ):
        super().__init__()
        self._cluster, self._store, self._locks = Cluster.of(cluster), store, locks
        self.process = process
        self._fence_ids = fence_ids
        self._ack_timeout = ack_timeout
        self._producer: Producer | None = None
        self._deliveries = Deliveries(store.topic)  # lease records not written, until the next flush
        self._held: dict[str, SendLease] = {}  # as this process last wrote them, once accepted
        self._used: dict[str, float] = {}  # monotonic time a statement last used each
        self._yielded: dict[str, float] = {}  # monotonic time this process let each go to a waiter
        self._mutex = threading.Lock()
        self._renewing = threading.Lock()
        self.idle_release = IDLE_RELEASE

    # --- what statements call --------------------------------------------------------------------

    def hold(self, handle: str, timeout: float) -> None:
        """Return once this process holds `handle`'s lease (claimed or renewed as needed); the
        caller holds the conversation's lock among this process's threads.
        ConversationLockTimeoutError if another process keeps it longer than `timeout`."""
        now = time.time()
        with self._mutex:
            mine = self._held.get(handle)
            self._used[handle] = time.monotonic()
        if mine is not None and mine.held_by(self.process, now):
            ep = self._store.cached(handle)
            nxt = ep.send_sequence if ep is not None else 0
            if not mine.must_renew_now(now, nxt + 1) and set(mine.fence) >= set(self._fence_ids()):
                return
            if self._renew(mine, nxt):
                return
        self._claim(handle, time.monotonic() + timeout, timeout)

    def created(self, ep: Endpoint) -> SendLease:
        """The first lease of an endpoint this process creates, to be written with it."""
        return first_claim(ep.conversation_handle, self.process, time.time(), self._fence_ids(), ep.send_sequence)

    def holding(self, lease: SendLease) -> None:
        """A lease written with a committed transaction (created()) is this process's."""
        with self._mutex:
            self._held[lease.handle] = lease
            self._used[lease.handle] = time.monotonic()

    def held(self, handle: str) -> bool:
        with self._mutex:
            return handle in self._held

    # --- claiming --------------------------------------------------------------------------------

    def _claim(self, handle: str, deadline: float, timeout: float) -> None:
        with self._mutex:
            yielded = self._yielded.pop(handle, None)
        if yielded is not None:  # give the waiter it went to the first chance to claim it
            time.sleep(max(0.0, min(yielded + YIELD_BACKOFF - time.monotonic(), deadline - time.monotonic())))
        said: int | None = None  # the epoch this process said it waits for
        while True:
            self._store.refresh()
            cur = self._store.lease(handle)
            now = time.time()
            if cur is not None and not cur.free_for(self.process, now):
                if time.monotonic() >= deadline:
                    raise ConversationLockTimeoutError(handle, timeout)
                if said != cur.epoch:
                    self._send(want_key(handle), Want(handle, cur.epoch, self.process).to_json())
                    said = cur.epoch
                time.sleep(min(POLL * 5, max(deadline - time.monotonic(), 0.0)))
                continue
            ep = self._store.get(handle)
            start = claim_start(ep, cur)
            claim = (
                first_claim(handle, self.process, now, self._fence_ids(), start)
                if cur is None
                else cur.claimed(self.process, now, self._fence_ids(), start)
            )
            self._write(claim)
            # Reading the claim back is Kafka's time, not another transaction's: its own bound.
            won = self._answer(claim, max(deadline, time.monotonic() + self._ack_timeout))
            if not won:
                continue
            if cur is not None and cur.owner not in (None, self.process):
                # It ran out without a release: whatever its holder still has open must not
                # commit after this process's SENDs.
                log.warning(
                    "conversation %s: the lease of %s ran out; taking it over and fencing it", handle, cur.owner
                )
                fence(self._cluster, cur.fence)
            self._store.advance(handle, start, cur.state if cur is not None else None)
            with self._mutex:
                self._held[handle] = claim
                self._used[handle] = time.monotonic()
            return

    def _answer(self, claim: SendLease, deadline: float) -> bool:
        """Read until the topic has decided on `claim`'s epoch: whether it was this claim."""
        while True:
            self._store.refresh()
            cur = self._store.lease(claim.handle)
            if cur is not None and cur.epoch >= claim.epoch:
                return cur == claim
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"the claim on conversation {claim.handle} was not read back")
            time.sleep(POLL)

    def _renew(self, mine: SendLease, next_sequence: int) -> bool:
        """Renew a held lease (longer, a higher ceiling, the current fence); False if it was lost."""
        return self._renew_all([(mine, next_sequence)]) == [True]

    def _renew_all(self, leases: list[tuple[SendLease, int]]) -> list[bool]:
        """Renew held leases with one flush and one read back; for each, whether it is still held.
        One renewal at a time (the keeper's and a statement's), each waiting for its own answer."""
        with self._renewing:
            return self._renew_now(leases)

    def _renew_now(self, leases: list[tuple[SendLease, int]]) -> list[bool]:
        fence_ids, now = self._fence_ids(), time.time()
        renewals = [mine.renewed(now, nxt, fence_ids) for mine, nxt in leases]
        for r in renewals:
            self._produce(lease_key(r.handle), r.to_json())
        self._flush()
        outcome: dict[str, bool] = {}
        deadline = time.monotonic() + self._ack_timeout
        while len(outcome) < len(renewals):
            self._store.refresh()
            for r in renewals:
                cur = self._store.lease(r.handle)
                if r.handle in outcome:
                    continue
                if cur == r or (
                    cur is not None and cur.epoch == r.epoch and cur.owner == self.process and cur.until >= r.until
                ):
                    outcome[r.handle] = True
                elif cur is None or cur.epoch != r.epoch or cur.owner != self.process:
                    outcome[r.handle] = False
                    log.warning("conversation %s: this process's lease was taken over", r.handle)
            if len(outcome) < len(renewals):
                if time.monotonic() >= deadline:
                    raise BrokerUnavailableError(f"lease renewals were not read back in {self._ack_timeout:g} s")
                time.sleep(POLL)
        with self._mutex:
            for r in renewals:
                if outcome[r.handle]:
                    self._held[r.handle] = r
                else:
                    self._held.pop(r.handle, None)
        return [outcome[r.handle] for r in renewals]

    def _release(self, handles: list[str]) -> None:
        """Let the leases of `handles` go: the exact endpoints first (one flush), then the
        releases (one more), so closing with many leases costs two round trips, not two each."""
        with self._mutex:
            mine = [m for h in handles if (m := self._held.pop(h, None)) is not None]
            for h in handles:
                self._used.pop(h, None)
        if not mine:
            return
        for lease in mine:
            self._store.write_exact(lease.handle)
        self._store.flush(self._ack_timeout)
        now = time.time()
        for lease in mine:
            ep = self._store.cached(lease.handle)
            released = lease.released(
                now, ep.send_sequence if ep is not None else lease.ceiling, ep.state if ep is not None else None
            )
            self._produce(lease_key(lease.handle), released.to_json())
        self._flush()

    def _write(self, lease: SendLease) -> None:
        self._send(lease_key(lease.handle), lease.to_json())

    def _send(self, key: str, value: bytes) -> None:
        self._produce(key, value)
        self._flush()

    def _produce(self, key: str, value: bytes) -> None:
        if self._producer is None:
            self._producer = idempotent_producer(self._cluster)
        self._producer.produce(self._store.topic, key=key, value=value, on_delivery=self._deliveries)
        self._producer.poll(0)

    def _flush(self) -> None:
        if self._producer is None:
            return
        left, failed = self._deliveries.flushed(
            self._producer, self._cluster, self._ack_timeout, "writing a conversation lease"
        )
        if left or failed:
            why = failed.str() if failed else f"not acknowledged in {self._ack_timeout:g} s"
            raise BrokerUnavailableError(f"a lease record was not written: {why}")

    # --- the keeper --------------------------------------------------------------------------------

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(KEEP_EVERY):
            try:
                self.keep()
                failing = False
            except Exception as exc:  # noqa: BLE001 - the broker is away: say so once, keep trying
                if not failing:
                    log.warning("keeping conversation leases failed (%s); retrying", exc)
                failing = True

    def keep(self) -> None:
        """Release leases that another process waits for, or that were idle for `idle_release`
        seconds, once no transaction of this process holds them; renew the rest before they
        run out."""
        now = time.monotonic()
        with self._mutex:
            held = list(self._held.values())
            used = dict(self._used)
        if held:
            self._store.refresh()  # wants written by waiting processes
        # Only a lease being let go is locked among the process's threads (so no transaction
        # uses it meanwhile), and only while it is: a renewal raises the ceiling and the end
        # time and never lowers either, so it needs no lock. Locking every held lease for the
        # whole pass held each conversation through the renewals' write and read back, so every
        # SEND of the process waited for them every few seconds.
        token = object()
        releasing, renewing = [], []
        try:
            for lease in held:
                want = self._store.wanted(lease.handle)
                if want is not None and want.epoch == lease.epoch and want.by != self.process:
                    used[lease.handle] = float("-inf")  # let it go as soon as no transaction holds it
                    with self._mutex:
                        self._yielded[lease.handle] = now
                if now - used.get(lease.handle, 0.0) >= self.idle_release and self._locks.try_lock(lease.handle, token):
                    releasing.append(lease.handle)
                elif lease.needs_renewal(time.time(), 0):
                    ep = self._store.cached(lease.handle)
                    renewing.append((lease, ep.send_sequence if ep is not None else 0))
            self._release(releasing)
        finally:
            self._locks.release(releasing, token)
        if renewing:
            self._renew_all(renewing)

    def close(self) -> None:
        """Stop the keeper and release every lease held, so other processes need not wait."""
        super().close()
        with self._mutex:
            handles = list(self._held)
        try:
            self._release(handles)
        except Exception as exc:  # noqa: BLE001 - logged: unreleased leases run out by themselves
            log.warning("%d conversation leases were not released (%s); they run out by themselves", len(handles), exc)
        if self._producer is not None:
            self._producer.flush(self._ack_timeout)
