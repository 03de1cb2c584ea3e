"""A transport endpoint (NServiceBus's SQL Server transport, docs/sources.md): its queues, its
concurrency model and its installer plan (the permissions the installer and the running endpoint
need are the transport roles of core/security/acl_roles.py). Pure: no I/O.

An endpoint `Sales` has one primary queue, `Sales`, shared by all its instances, and (unless
disabled) a secondary queue per instance, `Sales.<machine>`, where replies to what that instance
sent come back (callbacks). Each queue is a topic `kbroker.<ns>.tqueue.<queue>` read by the
consumer group of the same name.
"""

from __future__ import annotations

import re
import socket
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kbroker.core import names

QUEUE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,150}$")
MACHINE_RE = names.INSTANCE_RE  # no '.': `Endpoint.Machine` must stay one queue name

# The transport's three concurrency models (docs/sources.md), by the version that introduced them.
FIXED, RAMP, MONITOR = "fixed", "ramp", "monitor"
_MODEL_NAMES = {"fixed": FIXED, "pre-2.0": FIXED, "ramp": RAMP, "2.1": RAMP, "monitor": MONITOR, "3.0": MONITOR}

PRIMARY_PARTITIONS = 4  # competing instances share a primary queue by its partitions
SECONDARY_PARTITIONS = 1  # one instance reads its secondary queue
MAX_DELIVERIES = 5  # without recoverability: a message failed this often goes to the dead-letter topic
ERROR_QUEUE = "error"  # where failed messages go (NServiceBus's default), shared by the endpoints


def transport_queue_prefix(ns: str) -> str:
    """What every transport queue topic of the namespace starts with: `kbroker.<ns>.tqueue.`."""
    return f"{names.prefix(ns)}tqueue."


def transport_queue_topic(ns: str, queue: str) -> str:
    """The topic of a transport queue (primary or secondary): `kbroker.<ns>.tqueue.<queue>`."""
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue):
        raise ValueError(f"transport queue name {queue!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
    return f"{transport_queue_prefix(ns)}{queue}"


def parse_address(address: str, namespace: str) -> tuple[str, str]:
    """(queue, namespace) of a transport address: `queue`, in `namespace`, or `queue@namespace`
    for a queue of another namespace on the cluster (the SQL transport's `queue@schema`).
    ValueError naming what is wrong."""
    if not isinstance(address, str):
        raise ValueError(f"transport address {address!r} must be text")
    queue, at, ns = address.partition("@")
    if not QUEUE_RE.fullmatch(queue):
        raise ValueError(f"transport queue name {queue!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
    if at:
        names.prefix(ns)  # ValueError for a namespace that cannot be one
        return queue, ns
    return queue, namespace


def address_topic(address: str, namespace: str) -> str:
    """The topic of a transport address (parse_address) seen from `namespace`."""
    queue, ns = parse_address(address, namespace)
    return transport_queue_topic(ns, queue)


def model_name(value: str) -> str:
    """`fixed` (pre-2.0), `ramp` (2.1) or `monitor` (3.0), from any of those spellings."""
    try:
        return _MODEL_NAMES[str(value).strip().lower()]
    except KeyError:
        raise ValueError(
            f"concurrency model {value!r} is not one of fixed (pre-2.0), ramp (2.1), monitor (3.0)"
        ) from None


def default_machine() -> str:
    """This host's name as a queue suffix: characters other than A-Z a-z 0-9 _ - become '-'."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64]
    return name or "localhost"


@dataclass(frozen=True)
class TransportSettings:
    """How an endpoint instance receives. `max_concurrency` is MaximumConcurrencyLevel (the
    primary queue's readers or receive tasks at most); `secondary_readers` the secondary
    queue's (1 by default, as in 2.0); a satellite receiver has no secondary queue. A send-only
    endpoint receives nothing: no secondary queue, no delayed store of its own."""

    name: str
    machine: str
    secondary: bool = True
    model: str = MONITOR
    max_concurrency: int = 8
    secondary_readers: int = 1
    max_deliveries: int = MAX_DELIVERIES
    satellite: bool = False
    send_only: bool = False

    def __post_init__(self) -> None:
        if not QUEUE_RE.fullmatch(self.name or ""):
            raise ValueError(f"endpoint name {self.name!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
        if not MACHINE_RE.fullmatch(self.machine or ""):
            raise ValueError(f"machine name {self.machine!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
        object.__setattr__(self, "model", model_name(self.model))
        for field_name in ("max_concurrency", "secondary_readers", "max_deliveries"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field_name} must be a whole number of at least 1, not {value!r}")

    @property
    def primary_queue(self) -> str:
        return self.name

    @property
    def secondary_queue(self) -> str | None:
        """`Endpoint.Machine`, or None when secondaries are disabled or this is a satellite."""
        return None if not self.secondary or self.satellite or self.send_only else f"{self.name}.{self.machine}"

    @property
    def reply_address(self) -> str:
        """Where replies to this instance's sends go (ReplyToAddress)."""
        return self.secondary_queue or self.primary_queue


@dataclass(frozen=True)
class InstallPlan:
    """The topics an installer creates for one endpoint instance: (queue, partitions), and the
    endpoint's delayed store (with the primary queue's partitions). A satellite's queue
    (`Sales.Retries`) lies, by its name, among its endpoint's queue names; it has no store."""

    queues: tuple[tuple[str, int], ...]
    satellite: bool = False
    delayed: str | None = None  # the endpoint whose delayed store is created (core/transport/delayed.py)
    error: str | None = None  # the error queue, shared by the endpoints (core/transport/recoverability.py)
    audit: str | None = None  # the audit queue, shared too (core/transport/audit.py)
    bridges: tuple[str, ...] = ()  # the clusters the namespace's bridge topics lead to (core/transport/bridge.py)


def install_plan(
    name: str,
    machine: str | None,
    *,
    secondary: bool = True,
    partitions: int = PRIMARY_PARTITIONS,
    satellite: bool = False,
    error_queue: str | None = ERROR_QUEUE,
    audit_queue: str | None = None,
    bridges: tuple[str, ...] = (),
) -> InstallPlan:
    """The primary queue and, for a machine, its secondary queue (as NServiceBus installers
    create the tables when an instance first starts)."""
    settings = TransportSettings(
        name, machine or "installer", secondary=secondary and machine is not None, satellite=satellite
    )
    queues = [(settings.primary_queue, partitions)]
    if settings.secondary_queue is not None:
        queues.append((settings.secondary_queue, SECONDARY_PARTITIONS))
    for what, q in (("error", error_queue), ("audit", audit_queue)):
        if q is not None and not QUEUE_RE.fullmatch(q):
            raise ValueError(f"{what} queue {q!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
    return InstallPlan(tuple(queues), satellite, None if satellite else name, error_queue, audit_queue, bridges)


def install_collision(plan: InstallPlan, installed: Iterable[str]) -> tuple[str, str, str] | None:
    """(queue of the plan, installed queue, reason) when installing `plan` beside the transport
    queues already `installed` in the namespace would put two queues on one topic, or on topics
    Kafka refuses side by side; None when it is free.

    The primary queue claims its secondary queues' names, `Endpoint.<machine>`, as a catalog queue
    does (names.queue_names_collide). An installed queue inside that space is the endpoint's own
    secondary queue when the primary is installed too (a second install), and another endpoint's
    queue otherwise: whichever endpoint is installed second is refused. A secondary queue can then
    only meet another queue's topic by Kafka's '.'/'_' equality, checked last, as is a satellite's
    queue: it belongs among its endpoint's names, and a machine named like its suffix would share
    it (as in NServiceBus: the names alone cannot tell that secondary queue from the satellite's)."""
    primary = plan.queues[0][0]
    installed = sorted(set(installed))
    for other in [] if plan.satellite else installed:
        reason = names.queue_names_collide(primary, other)
        own_secondary = primary in installed and len(other) > len(primary)
        if reason is not None and not own_secondary:
            return primary, other, reason
    for queue, _partitions in plan.queues[1:] if not plan.satellite else plan.queues:
        for other in installed:
            if other != queue and names.kafka_form(other) == names.kafka_form(queue):
                return queue, other, "Kafka treats '.' and '_' in topic names as one character, so their topics collide"
    return None


def receive_tasks_to_start(waiting: int, running: int, max_concurrency: int) -> int:
    """3.0's monitoring loop: one receive task per waiting message, never more than
    MaximumConcurrencyLevel running at once."""
    return max(0, min(waiting, max_concurrency - running))


class FailedDeliveries:
    """How often each message's handler failed in this process, and why last (NServiceBus
    counts immediate retries in memory too). Bounded: the oldest entries go past `cap`."""

    def __init__(self, cap: int = 10_000):
        self._cap = cap
        self._counts: OrderedDict[tuple[str, int, int], tuple[int, str, Any]] = OrderedDict()
        self._retries: OrderedDict[tuple[str, int, int], None] = OrderedDict()  # on_error said RETRY

    def failed(self, position: tuple[str, int, int], reason: str = "", failure: Any = None) -> int:
        """One more failure of the message at (topic, partition, offset), why (and what was
        raised, for the error queue's headers); returns its count."""
        n = self._counts.pop(position, (0, "", None))[0] + 1
        self._counts[position] = (n, reason, failure)
        while len(self._counts) > self._cap:
            self._counts.popitem(last=False)
        return n

    def count(self, position: tuple[str, int, int]) -> int:
        return self._counts.get(position, (0, "", None))[0]

    def reason(self, position: tuple[str, int, int]) -> str:
        return self._counts.get(position, (0, "", None))[1]

    def failure(self, position: tuple[str, int, int]) -> Any:
        """What the last failure raised, as recorded (core/transport/recoverability.Failure), or None."""
        return self._counts.get(position, (0, "", None))[2]

    def forget(self, position: tuple[str, int, int]) -> None:
        self._counts.pop(position, None)
        self._retries.pop(position, None)

    def request_retry(self, position: tuple[str, int, int]) -> None:
        """The next delivery of this message is an immediate retry, whatever the policy says."""
        self._retries.pop(position, 0)  # a newer request: the newest, the last to go past the cap
        self._retries[position] = None
        while len(self._retries) > self._cap:
            self._retries.popitem(last=False)

    def take_retry(self, position: tuple[str, int, int]) -> bool:
        """Whether a retry was requested for this message (and no longer is)."""
        return self._retries.pop(position, 0) is None
