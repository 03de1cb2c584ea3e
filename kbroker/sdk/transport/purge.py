"""Purging expired messages when an endpoint starts: NServiceBus's PurgeExpiredMessagesOnStartup
(docs/transport.md, Receiving: expired messages at start-up).

    purge_expired(ep, None, 30.0)     # ep's primary and secondary queues; returns how many went

One bounded pass per input queue over the partitions the queue's consumer group gives this
instance: each partition's run of expired messages at its head, from its committed offset up to
its first live message, is removed by committing their offsets, in batches, through the
process's group committer (Kafka transactions carrying the group's generation, as every receive
commits: another instance holding the partition by then fences them). Nothing live is taken,
and nothing past a message the pass has not looked at (core/receive/expired_heads.py). Expired
messages behind a live one stay: a Kafka partition is only ever trimmed from its start, and
receives remove them as they reach them.

The pass ends when every partition is settled (its head live, or the partition read to its end
with nothing expired left) or after `timeout` seconds, whichever comes first. The bound is for
what the pass cannot see end: the group's assignment (a join takes seconds; a rebalance another
instance starts meanwhile restarts it), a partition whose committed offsets an open Kafka
transaction holds (up to a minute), a consumer paused by back-pressure while live records of
other partitions fill the buffer, or an expired backlog longer than the start may wait. What the
pass leaves is removed as receives reach it, so stopping early loses nothing. Memory stays that
of the receiver (`max_buffered` records) plus one batch of leases.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kbroker.errors import InvalidArgumentError, KBrokerError
from kbroker.kafka.receive.receiver import QueueReceiver
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.sdk.transport.runtime import TransportRuntime

log = logging.getLogger("kbroker.transport")

PURGE_TIMEOUT = 30.0  # seconds a start waits at most for the purge (see the module's docstring)
BATCH = 1000  # expired messages removed per Kafka transaction
WAIT = 0.1  # seconds a round waits for the poll thread's next records when it found nothing to take


class HasRuntime(Protocol):
    """An endpoint (sdk/transport/endpoint.TransportEndpoint): its process runtime."""

    @property
    def runtime(self) -> TransportRuntime: ...


def purge_timeout(value: float) -> float:
    """`value` as the purge's time-out: a positive number of seconds, at most an hour;
    InvalidArgumentError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600 or math.isnan(value):
        raise InvalidArgumentError(f"purge_timeout must be 0-3600 seconds (more than 0), not {value!r}")
    return float(value)


@dataclass(frozen=True)
class StartupPurge:
    """Whether an endpoint's start() purges expired messages before its readers run
    (`purge_expired_on_startup`), and within how long (`purge_timeout`, validated here)."""

    enabled: bool = False
    timeout: float = PURGE_TIMEOUT

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise InvalidArgumentError(f"purge_expired_on_startup must be True or False, not {self.enabled!r}")
        object.__setattr__(self, "timeout", purge_timeout(self.timeout))

    def run(self, endpoint: HasRuntime) -> int:
        """The start-up pass over the endpoint's input queues when enabled (purge_expired); 0 when not."""
        return purge_expired(endpoint, None, self.timeout) if self.enabled else 0


def purge_expired(
    endpoint_or_runtime: HasRuntime | TransportRuntime,
    queues: Iterable[str] | None = None,
    timeout: float = PURGE_TIMEOUT,
) -> int:
    """Remove the expired messages at the head of each partition this instance is assigned of
    `queues` (None: the endpoint's input queues, primary and secondary), within `timeout`
    seconds in all; returns how many it removed. Each queue's count is logged once (`purged N
    expired messages from Q`) and added to the endpoint's `purged` counter (stats()). Meant for
    before the readers run (TransportEndpoint.start); a failure is logged and the start goes on,
    the messages left are removed as receives reach them."""
    rt = endpoint_or_runtime if isinstance(endpoint_or_runtime, TransportRuntime) else endpoint_or_runtime.runtime
    deadline = time.monotonic() + purge_timeout(timeout)
    s = rt.settings
    if queues is None:
        queues = [] if s.send_only else [q for q in (s.primary_queue, s.secondary_queue) if q is not None]
    now_ms = int(time.time() * 1000)  # expired as of the pass's start: a head live then stays
    receivers: dict[str, QueueReceiver] = {}
    for q in queues:  # every queue's consumer joins its group now, so their assignments overlap
        try:
            receivers[q] = rt.receiver(q)
        except KBrokerError as exc:
            log.warning("expired messages of %s not purged: %s", q, exc)
    total = 0
    for q, receiver in receivers.items():
        n = _purge_queue(rt, q, receiver, now_ms, deadline)
        log.info("purged %d expired messages from %s", n, q)
        total += n
    return total


def _purge_queue(rt: TransportRuntime, queue: str, receiver: QueueReceiver, now_ms: int, deadline: float) -> int:
    """One queue's pass: rounds of take-commit-release until every owned partition is settled or
    the deadline passes; how many were removed."""
    owner = object()  # the leases' owner: the purge's own, no transaction's
    purged = 0
    failed = ""
    while True:
        try:
            leases, unsettled = receiver.take_expired_heads(
                owner, now_ms, limit=BATCH, wait=max(min(WAIT, deadline - time.monotonic()), 0.0)
            )
        except KBrokerError as exc:  # the authorizer refused the queue's read: receives will say so too
            log.warning("purging expired messages of %s stopped after %d: %s", queue, purged, exc)
            return purged
        committed = True
        if leases:
            try:
                rt.committer.commit(CommitRequest([], leases))
            except Exception as exc:  # noqa: BLE001 - a rebalance, or Kafka away: the records go back, tried again
                committed = False  # what it took is back at the head: not settled, whatever the round said
                for lease in leases:
                    receiver.release(lease, False)
                if str(exc) != failed:
                    failed = str(exc)
                    log.warning("purging expired messages of %s: a commit failed, trying again: %s", queue, exc)
                time.sleep(max(min(WAIT, deadline - time.monotonic()), 0.0))
            else:
                for lease in leases:
                    receiver.release(lease, True)
                purged += len(leases)
                rt.count("purged", len(leases))
        if (committed and unsettled == []) or rt.closing():
            return purged
        if time.monotonic() >= deadline:
            log.warning(
                "purging expired messages of %s stopped at its time-out after %d; %s: "
                "their expired messages are removed as receives reach them",
                queue,
                purged,
                "its last commit failed"
                if not committed
                else "the group had assigned this instance nothing yet"
                if unsettled is None
                else f"partitions {unsettled} not read to their first live message",
            )
            return purged
