"""Least privilege: the Kafka ACLs each kbroker role needs, as pure plans (kafka/security/acls.py applies
them). Pure: no I/O.

Every name kbroker gives a topic, a consumer group or a transactional id lies under the
namespace's prefix P = `kbroker.<ns>.` (core/names.py), so a namespace's rights are PREFIXED
rules on P (with its trailing dot: `kbroker.sales` would also match `kbroker.salesforce.`) or
LITERAL rules on one of its topics. A role is a list of Rules (resource, pattern, operations, why);
`bindings` gives one principal those rules as AclBindings.

The roles, by the process that runs with them:

    sender               an SDK process that BEGINs dialogs and SENDs outside a transaction
    reader               an SDK process that RECEIVEs in transactions (and commits them)
    app                  both: an application that SENDs and RECEIVEs in transactions
    worker               `kbroker worker` (Faust, monitors, activation, tick, reclaim, timers, routing)
    analytics            `kbroker analytics run` (Spark reads the namespace, writes results)
    router               the transmitter and dispatcher (`--route-to NS`: a route to that namespace)
    transport-installer  `kbroker endpoint install` (creates an endpoint's queue topics)
    transport-runner     a running transport endpoint (reads its queues, sends to any)
    deployer             `kbroker apply` (creates and configures topics, publishes the catalog)

Operations a rule grants imply DESCRIBE (Kafka: READ, WRITE, DELETE, ALTER imply it), so rules
name DESCRIBE only where nothing else is granted. No role needs IDEMPOTENT_WRITE on the cluster:
since Kafka 2.8 WRITE on any topic lets a producer be idempotent (KIP-679).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kbroker.core import names
from kbroker.core.transport.endpoint import transport_queue_prefix, transport_queue_topic

RESOURCE_TYPES = ("TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER")
PATTERNS = ("LITERAL", "PREFIXED")
OPERATIONS = ("READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
              "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "CLUSTER_ACTION")
CLUSTER_NAME = "kafka-cluster"  # the one name of Kafka's cluster resource
PRINCIPAL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*:\S.*$")  # `User:alice`, as Kafka spells principals


def check_principal(principal: str) -> str:
    """`principal` when it reads as Kafka's `Type:name` (User:alice); ValueError otherwise."""
    if not isinstance(principal, str) or not PRINCIPAL_RE.match(principal) or principal.endswith(":*"):
        raise ValueError(f"principal {principal!r} must be Kafka's Type:name, e.g. User:alice")
    return principal


@dataclass(frozen=True, order=True)
class AclBinding:
    """One Kafka ACL: principal, operation, resource type, pattern type, resource name; it allows,
    from any host, unless listed otherwise."""

    principal: str
    operation: str
    resource_type: str
    pattern: str
    name: str
    permission: str = "ALLOW"  # as listed from a cluster; kbroker's plans only allow
    host: str = "*"

    def command(self, bootstrap: str) -> str:
        """The `kafka-acls.sh` line that grants it."""
        flag = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id",
                "CLUSTER": "--cluster"}[self.resource_type]
        target = flag if self.resource_type == "CLUSTER" else f"{flag} '{self.name}'"
        pattern = f" --resource-pattern-type {self.pattern.lower()}" if self.resource_type != "CLUSTER" else ""
        return (f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal '{self.principal}' "
                f"--operation {self.operation}{pattern} {target}")

    def covers(self, resource_type: str, name: str) -> bool:
        """Whether this binding's resource pattern matches the resource `name` of that type."""
        if resource_type != self.resource_type:
            return False
        return name == self.name if self.pattern == "LITERAL" else name.startswith(self.name)

    def as_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "operation": self.operation, "resource_type": self.resource_type,
                "pattern": self.pattern, "name": self.name, "permission": self.permission, "host": self.host}


@dataclass(frozen=True)
class Rule:
    """What a role is granted on one resource pattern, and why (the table `kbroker acls roles`
    prints)."""

    resource_type: str
    pattern: str
    name: str
    operations: tuple[str, ...]
    why: str

    def __post_init__(self) -> None:
        if self.resource_type not in RESOURCE_TYPES or self.pattern not in PATTERNS:
            raise ValueError(f"rule on {self.resource_type} {self.pattern} {self.name!r}: unknown type or pattern")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown or not self.operations:
            raise ValueError(f"rule on {self.name!r}: unknown operations {unknown or 'none given'}")


@dataclass(frozen=True)
class RoleOptions:
    """What narrows or widens a role: a transport endpoint (its queues only, else every
    transport queue of the namespace), and the namespaces on this cluster the router delivers to."""

    endpoint: str | None = None
    routes_to: tuple[str, ...] = ()


# --- the rule sets the roles are made of ---------------------------------------------------------


def _catalog_reader(ns: str) -> list[Rule]:
    """What every process that reads the catalog and the namespace's compacted topics needs."""
    return [
        Rule("TOPIC", "LITERAL", names.catalog_topic(ns), ("READ",),
             "the catalog: services, contracts, queues (read at start and watched)"),
        Rule("GROUP", "LITERAL", names.reader_group(ns), ("DESCRIBE",),
             "the group id of kbroker's assign-only readers: librdkafka looks its coordinator up"),
    ]


def sender_base(ns: str) -> list[Rule]:
    """What a process that SENDs needs besides WRITE on the queues it sends to."""
    return _catalog_reader(ns) + [
        Rule("TOPIC", "LITERAL", names.endpoints_topic(ns), ("READ", "WRITE"),
             "conversation endpoints and the send leases that carry SEND's conversation locks"),
        Rule("TOPIC", "LITERAL", names.timers_topic(ns), ("WRITE",), "BEGIN DIALOG ... LIFETIME: the dialog lifetime"),
        Rule("TOPIC", "LITERAL", names.transmission_topic(ns), ("WRITE",),
             "SEND to a service of another namespace (a route): the transmission queue"),
        Rule("TRANSACTIONAL_ID", "PREFIXED", names.prefix(ns), ("WRITE",),
             "a lapsed send lease: its holder's transactional ids are fenced before it is taken"),
    ]


def _sender(ns: str) -> list[Rule]:
    return sender_base(ns) + [
        Rule("TOPIC", "PREFIXED", f"{names.prefix(ns)}queue.", ("WRITE",),
             "SEND: the far side's queue (or its secondary queue)"),
    ]


def receiver_base(ns: str) -> list[Rule]:
    """What a process that RECEIVEs needs besides READ on its queues and their groups."""
    return _catalog_reader(ns) + [
        Rule("TRANSACTIONAL_ID", "PREFIXED", names.prefix(ns), ("WRITE",),
             "the group committer's transactions (offsets and records commit together)"),
        Rule("TOPIC", "LITERAL", names.endpoints_topic(ns), ("READ", "WRITE"),
             "conversation endpoints: the receive sequence, END CONVERSATION's state"),
        Rule("TOPIC", "LITERAL", names.events_topic(ns), ("READ", "WRITE"),
             "rollback counts of every process (poison-message handling), dead-letter events"),
        Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("WRITE",), "records that are not messages"),
        Rule("TOPIC", "LITERAL", names.readers_topic(ns), ("WRITE",),
             "this process's locks and in-flight counts (`kbroker queue show`)"),
    ]  # no catalog WRITE: only its owner changes it (a poison message: see sdk/runtime.note_rollback)


def _reader(ns: str) -> list[Rule]:
    return receiver_base(ns) + [
        Rule("TOPIC", "PREFIXED", f"{names.prefix(ns)}queue.", ("READ", "CREATE"),
             "RECEIVE: the queue topics (and secondary queues, created on first use)"),
        Rule("GROUP", "PREFIXED", f"{names.prefix(ns)}queue.", ("READ",),
             "a queue's consumer group: joined, and its offsets committed with each transaction"),
    ]


# The topics the worker writes besides its queues and Faust's: never the catalog (its owner's),
# the analytics results or the control topic (the analytics job's).
_WORKER_WRITES = (names.endpoints_topic, names.events_topic, names.deadletter_topic, names.timers_topic,
                  names.transmission_topic, names.readers_topic, names.progress_topic, names.acks_topic,
                  names.link_reports_topic, names.monitor_events_topic, names.ticks_topic)


def _worker(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule("TOPIC", "PREFIXED", p, ("READ", "CREATE", "DELETE"),
             "every topic of the namespace: monitors, activation, tick, timers, routing; CREATE: its "
             "own topics and Faust's changelogs; DELETE: the 5th-tick reclaim (DeleteRecords)"),
        Rule("TOPIC", "PREFIXED", f"{p}queue.", ("WRITE",),
             "activated readers' SENDs, DialogTimer and lifetime errors, routed messages delivered"),
        Rule("TOPIC", "PREFIXED", names.worker_app_id(ns), ("WRITE",), "Faust's changelog and assignor topics"),
        *(Rule("TOPIC", "LITERAL", topic(ns), ("WRITE",), "what the worker's services record")
          for topic in _WORKER_WRITES),
        Rule("GROUP", "PREFIXED", p, ("READ",),
             "Faust's group (kbroker.<ns>.worker), the queue groups it counts, the timer, "
             "transmitter and dispatcher groups, kbroker's readers"),
        Rule("TRANSACTIONAL_ID", "PREFIXED", p, ("WRITE",),
             "the timer service's, the dispatcher's and its readers' transactions"),
    ]


def _analytics(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule("TOPIC", "PREFIXED", p, ("READ",), "Spark reads the namespace's queues and system topics"),
        Rule("GROUP", "PREFIXED", p, ("READ",),
             "Spark's groups (groupIdPrefix kbroker.<ns>.analytics-source), the analytics group's "
             "committed offsets, kbroker's readers"),
        Rule("TOPIC", "LITERAL", names.analytics_topic(ns), ("WRITE",), "the job's results"),
        Rule("TOPIC", "LITERAL", names.control_topic(ns), ("WRITE",), "RECLASSIFY commands to the workers"),
        Rule("TRANSACTIONAL_ID", "LITERAL", names.analytics_transactional_id(ns), ("WRITE",),
             "the job's one producer per namespace (a second job fences the first)"),
    ]


def _router(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return _catalog_reader(ns) + [
        Rule("TOPIC", "LITERAL", names.transmission_topic(ns), ("READ",), "the transmitter reads the transmission queue"),
        Rule("GROUP", "LITERAL", names.transmitter_group(ns), ("READ",), "its offsets are the transmission queue's head"),
        Rule("TOPIC", "LITERAL", names.inbound_topic(ns), ("READ",), "the dispatcher reads what other namespaces sent"),
        Rule("GROUP", "LITERAL", names.dispatcher_group(ns), ("READ",), "the dispatcher's group"),
        Rule("TRANSACTIONAL_ID", "PREFIXED", names.dispatcher_group(ns) + ".", ("WRITE",),
             "the dispatcher saves messages, acknowledgements and offsets in one transaction"),
        Rule("TOPIC", "PREFIXED", f"{p}queue.", ("WRITE",),
             "delivered messages, and errors for refused dialogs, into the namespace's queues"),
        Rule("TOPIC", "LITERAL", names.acks_topic(ns), ("READ", "WRITE"), "the dispatcher's acknowledgements"),
        Rule("TOPIC", "LITERAL", names.events_topic(ns), ("WRITE",), "broker events (BROKER_CONNECTION, ...)"),
        Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("WRITE",),
             "routing records refused (forged, undecodable), kept with their reason"),
        Rule("TOPIC", "LITERAL", names.link_reports_topic(ns), ("WRITE",),
             "the transmitter's reports (sys.transmission_queue, sys.dm_broker_connections)"),
    ]


def _routes_to(routes_to: Sequence[str]) -> list[Rule]:
    """A transmitter's link to each namespace on this cluster it delivers to."""
    return [rule for other in routes_to for rule in (
        Rule("TOPIC", "LITERAL", names.inbound_topic(other), ("WRITE",), f"a route to namespace {other}: its inbound topic"),
        Rule("TOPIC", "LITERAL", names.acks_topic(other), ("READ",), f"namespace {other}'s acknowledgements"),
        Rule("GROUP", "LITERAL", names.reader_group(other), ("DESCRIBE",), f"the group id reading namespace {other}'s acks"),
    )]


def _endpoint_queues(ns: str, endpoint: str | None) -> list[tuple[str, str]]:
    """(pattern, name) of an endpoint's queue topics (its primary queue and every
    `Endpoint.<machine>`), or of every transport queue of the namespace."""
    if endpoint is None:
        return [("PREFIXED", transport_queue_prefix(ns))]
    primary = transport_queue_topic(ns, endpoint)
    return [("LITERAL", primary), ("PREFIXED", primary + ".")]  # a bare prefix would match `EndpointX`


def _transport_installer(ns: str, endpoint: str | None) -> list[Rule]:
    own = _endpoint_queues(ns, endpoint)
    return [Rule("TOPIC", pattern, name, ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
                 "the endpoint's queues (CREATE TABLE, VIEW DEFINITION)") for pattern, name in own] + [
        Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
             "the dead-letter topic poison messages go to"),
    ]


def _transport_runner(ns: str, endpoint: str | None) -> list[Rule]:
    own = _endpoint_queues(ns, endpoint)
    return [Rule("TOPIC", pattern, name, ("READ",), "receive from the endpoint's queues") for pattern, name in own] + [
        Rule("GROUP", pattern, name, ("READ",), "a queue's consumer group (named as its topic)") for pattern, name in own
    ] + [
        Rule("TOPIC", "PREFIXED", transport_queue_prefix(ns), ("WRITE",), "send to any transport queue of the namespace"),
        Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("WRITE",), "poison messages"),
        Rule("TRANSACTIONAL_ID", "PREFIXED", names.prefix(ns), ("WRITE",),
             "the group committer's transactions (a receive's removal and its handler's sends)"),
    ]


def _deployer(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule("TOPIC", "PREFIXED", p, ("DESCRIBE", "CREATE", "ALTER", "ALTER_CONFIGS", "DESCRIBE_CONFIGS"),
             "see, create and configure the catalog's topics; grow their partitions (ALTER)"),
        Rule("TOPIC", "LITERAL", names.catalog_topic(ns), ("READ", "WRITE"),
             "read the catalog applied before, publish the new one"),
        Rule("GROUP", "PREFIXED", p, ("DESCRIBE",),
             "whether a queue that grows has readers (its group), kbroker's readers' group"),
    ]


@dataclass(frozen=True)
class Role:
    """A role: what it is for, and its rules for a namespace and options."""

    name: str
    summary: str
    rules_for: Callable[[str, RoleOptions], list[Rule]]


ROLES: dict[str, Role] = {r.name: r for r in (
    Role("sender", "an SDK process that BEGINs dialogs and SENDs outside a transaction",
         lambda ns, _o: _sender(ns)),
    Role("reader", "an SDK process that RECEIVEs in transactions and commits them",
         lambda ns, _o: _reader(ns)),
    Role("app", "an application that SENDs and RECEIVEs in transactions (sender and reader)",
         lambda ns, _o: _sender(ns) + _reader(ns)),
    Role("worker", "`kbroker worker`: monitors, activation, tick, reclaim, timers and routing",
         lambda ns, o: _worker(ns) + _routes_to(o.routes_to)),
    Role("analytics", "`kbroker analytics run`: the Spark job of the namespace", lambda ns, _o: _analytics(ns)),
    Role("router", "the transmitter and the dispatcher (messages between namespaces on this cluster)",
         lambda ns, o: _router(ns) + _routes_to(o.routes_to)),
    Role("transport-installer", "`kbroker endpoint install`: creates a transport endpoint's queues",
         lambda ns, o: _transport_installer(ns, o.endpoint)),
    Role("transport-runner", "a running transport endpoint: receives from its queues, sends to any",
         lambda ns, o: _transport_runner(ns, o.endpoint)),
    Role("deployer", "`kbroker apply`: creates and configures the catalog's topics, publishes the catalog",
         lambda ns, _o: _deployer(ns)),
)}


def role(name: str) -> Role:
    """The role of that name; ValueError naming the roles otherwise."""
    try:
        return ROLES[name]
    except KeyError:
        raise ValueError(f"unknown role {name!r} (one of {', '.join(ROLES)})") from None


def rules(role_name: str, namespace: str, *, endpoint: str | None = None,
          routes_to: Sequence[str] = ()) -> list[Rule]:
    """What `role_name` needs in `namespace` (see RoleOptions for `endpoint` and `routes_to`),
    one rule per resource pattern: a pattern two rule sets name gets the union of their operations."""
    merged: dict[tuple[str, str, str], Rule] = {}
    for r in role(role_name).rules_for(namespace, RoleOptions(endpoint, tuple(routes_to))):
        key = (r.resource_type, r.pattern, r.name)
        old = merged.get(key)
        if old is None:
            merged[key] = r
        elif not set(r.operations) <= set(old.operations):
            ops = old.operations + tuple(op for op in r.operations if op not in old.operations)
            merged[key] = Rule(r.resource_type, r.pattern, r.name, ops, f"{old.why}; {r.why}")
    return list(merged.values())


def bindings(role_name: str, principal: str, namespace: str, *, endpoint: str | None = None,
             routes_to: Sequence[str] = ()) -> list[AclBinding]:
    """The ACLs that give `principal` what `role_name` needs in `namespace`: one per rule and
    operation, none twice."""
    check_principal(principal)
    return [AclBinding(principal, op, r.resource_type, r.pattern, r.name)
            for r in rules(role_name, namespace, endpoint=endpoint, routes_to=routes_to) for op in r.operations]


def transport_split(ns: str, endpoint: str, installer: str, runner: str) -> list[AclBinding]:
    """The transport's split of an endpoint's permissions between two principals: the installer
    may create the endpoint's queue topics (CREATE TABLE, VIEW DEFINITION); the running endpoint
    only reads and writes (db_datareader, db_datawriter)."""
    return (bindings("transport-installer", installer, ns, endpoint=endpoint)
            + bindings("transport-runner", runner, ns, endpoint=endpoint))


def allowed(acls: Sequence[AclBinding], principal: str, operation: str, resource_type: str, name: str) -> bool:
    """Whether `acls` allow `principal` the operation on the resource, with the operations Kafka
    implies (READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS)."""
    implied = {"DESCRIBE": {"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER"},
               "DESCRIBE_CONFIGS": {"DESCRIBE_CONFIGS", "ALTER_CONFIGS"}}.get(operation, {operation})
    return any(a.principal == principal and a.operation in implied and a.permission == "ALLOW"
               and a.covers(resource_type, name) for a in acls)
