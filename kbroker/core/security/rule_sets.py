"""The rule sets kbroker's roles are made of: for a namespace, what each kind of process reads,
writes, creates and joins, each rule with why. Pure: no I/O. Apart from acl_roles.py, which names
the roles, combines these sets and gives them to principals, because the sets are long tables,
each read against the code paths of one kind of process.
"""

from __future__ import annotations

from collections.abc import Sequence

from kbroker.core import names
from kbroker.core.security.acl_bindings import Rule


def _catalog_reader(ns: str) -> list[Rule]:
    """What every process that reads the catalog and the namespace's compacted topics needs."""
    return [
        Rule(
            "TOPIC",
            "LITERAL",
            names.catalog_topic(ns),
            ("READ",),
            "the catalog: services, contracts, queues (read at start and watched)",
        ),
        Rule(
            "GROUP",
            "LITERAL",
            names.reader_group(ns),
            ("DESCRIBE",),
            "the group id of kbroker's assign-only readers: librdkafka looks its coordinator up",
        ),
    ]


def sender_base(ns: str) -> list[Rule]:
    """What a process that SENDs needs besides WRITE on the queues it sends to."""
    return _catalog_reader(ns) + [
        Rule(
            "TOPIC",
            "LITERAL",
            names.endpoints_topic(ns),
            ("READ", "WRITE"),
            "conversation endpoints and the send leases that carry SEND's conversation locks",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.holds_topic(ns),
            ("READ", "WRITE"),
            "the conversation group lock across processes: a statement's hold on a group another process reads",
        ),
        Rule("TOPIC", "LITERAL", names.timers_topic(ns), ("WRITE",), "BEGIN DIALOG ... LIFETIME: the dialog lifetime"),
        Rule(
            "TOPIC",
            "LITERAL",
            names.transmission_topic(ns),
            ("WRITE",),
            "SEND to a service of another namespace (a route): the transmission queue",
        ),
        Rule(
            "TRANSACTIONAL_ID",
            "PREFIXED",
            names.prefix(ns),
            ("WRITE",),
            "a lapsed send lease: its holder's transactional ids are fenced before it is taken",
        ),
    ]


def sender(ns: str) -> list[Rule]:
    return sender_base(ns) + [
        Rule(
            "TOPIC",
            "PREFIXED",
            f"{names.prefix(ns)}queue.",
            ("WRITE",),
            "SEND: the far side's queue (or its secondary queue)",
        ),
    ]


def receiver_base(ns: str) -> list[Rule]:
    """What a process that RECEIVEs needs besides READ on its queues and their groups."""
    return _catalog_reader(ns) + [
        Rule(
            "TRANSACTIONAL_ID",
            "PREFIXED",
            names.prefix(ns),
            ("WRITE",),
            "the group committer's transactions (offsets and records commit together)",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.endpoints_topic(ns),
            ("READ", "WRITE"),
            "conversation endpoints: the receive sequence, END CONVERSATION's state",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.holds_topic(ns),
            ("READ", "WRITE"),
            "the group lock across processes: grants to other processes' holds on this reader's groups",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.events_topic(ns),
            ("READ", "WRITE"),
            "rollback counts of every process (poison-message handling), dead-letter events",
        ),
        Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("WRITE",), "records that are not messages"),
        Rule(
            "TOPIC",
            "LITERAL",
            names.readers_topic(ns),
            ("READ", "WRITE"),
            "this process's locks and in-flight counts, and every reader's for `kbroker queue show`",
        ),
    ]  # no catalog WRITE: only its owner changes it (a poison message: see sdk/runtime.note_rollback)


def reader(ns: str) -> list[Rule]:
    return receiver_base(ns) + [
        Rule(
            "TOPIC",
            "PREFIXED",
            f"{names.prefix(ns)}queue.",
            ("READ", "CREATE"),
            "RECEIVE: the queue topics (and secondary queues, created on first use)",
        ),
        Rule(
            "GROUP",
            "PREFIXED",
            f"{names.prefix(ns)}queue.",
            ("READ",),
            "a queue's consumer group: joined, and its offsets committed with each transaction",
        ),
    ]


# The topics the worker writes besides its queues and Faust's: never the catalog (its owner's),
# the analytics results or the control topic (the analytics job's).
_WORKER_WRITES = (
    names.endpoints_topic,
    names.holds_topic,
    names.events_topic,
    names.deadletter_topic,
    names.timers_topic,
    names.transmission_topic,
    names.readers_topic,
    names.progress_topic,
    names.acks_topic,
    names.link_reports_topic,
    names.monitor_events_topic,
    names.ticks_topic,
)


def worker(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule(
            "TOPIC",
            "PREFIXED",
            p,
            ("READ", "CREATE", "DELETE"),
            "every topic of the namespace: monitors, activation, tick, timers, routing; CREATE: its "
            "own topics and Faust's changelogs; DELETE: the 5th-tick reclaim (DeleteRecords)",
        ),
        Rule(
            "TOPIC",
            "PREFIXED",
            f"{p}queue.",
            ("WRITE",),
            "activated readers' SENDs, DialogTimer and lifetime errors, routed messages delivered",
        ),
        Rule("TOPIC", "PREFIXED", names.worker_app_id(ns), ("WRITE",), "Faust's changelog and assignor topics"),
        *(
            Rule("TOPIC", "LITERAL", topic(ns), ("WRITE",), "what the worker's services record")
            for topic in _WORKER_WRITES
        ),
        Rule(
            "GROUP",
            "PREFIXED",
            p,
            ("READ",),
            "Faust's group (kbroker.<ns>.worker), the queue groups it counts, the timer, "
            "transmitter and dispatcher groups, kbroker's readers",
        ),
        Rule(
            "TRANSACTIONAL_ID",
            "PREFIXED",
            p,
            ("WRITE",),
            "the timer service's, the dispatcher's and its readers' transactions",
        ),
    ]


def analytics(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule("TOPIC", "PREFIXED", p, ("READ",), "Spark reads the namespace's queues and system topics"),
        Rule(
            "GROUP",
            "PREFIXED",
            p,
            ("READ",),
            "Spark's groups (groupIdPrefix kbroker.<ns>.analytics-source), the analytics group's "
            "committed offsets, kbroker's readers",
        ),
        Rule("TOPIC", "LITERAL", names.analytics_topic(ns), ("WRITE",), "the job's results"),
        Rule("TOPIC", "LITERAL", names.control_topic(ns), ("WRITE",), "RECLASSIFY commands to the workers"),
        Rule(
            "TRANSACTIONAL_ID",
            "LITERAL",
            names.analytics_transactional_id(ns),
            ("WRITE",),
            "the job's one producer per namespace (a second job fences the first)",
        ),
    ]


def router(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return _catalog_reader(ns) + [
        Rule(
            "TOPIC", "LITERAL", names.transmission_topic(ns), ("READ",), "the transmitter reads the transmission queue"
        ),
        Rule(
            "GROUP", "LITERAL", names.transmitter_group(ns), ("READ",), "its offsets are the transmission queue's head"
        ),
        Rule("TOPIC", "LITERAL", names.inbound_topic(ns), ("READ",), "the dispatcher reads what other namespaces sent"),
        Rule("GROUP", "LITERAL", names.dispatcher_group(ns), ("READ",), "the dispatcher's group"),
        Rule(
            "TRANSACTIONAL_ID",
            "PREFIXED",
            names.dispatcher_group(ns) + ".",
            ("WRITE",),
            "the dispatcher saves messages, acknowledgements and offsets in one transaction",
        ),
        Rule(
            "TOPIC",
            "PREFIXED",
            f"{p}queue.",
            ("WRITE",),
            "delivered messages, and errors for refused dialogs, into the namespace's queues",
        ),
        Rule("TOPIC", "LITERAL", names.acks_topic(ns), ("READ", "WRITE"), "the dispatcher's acknowledgements"),
        Rule("TOPIC", "LITERAL", names.events_topic(ns), ("WRITE",), "broker events (BROKER_CONNECTION, ...)"),
        Rule(
            "TOPIC",
            "LITERAL",
            names.deadletter_topic(ns),
            ("WRITE",),
            "routing records refused (forged, undecodable), kept with their reason",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.link_reports_topic(ns),
            ("WRITE",),
            "the transmitter's reports (sys.transmission_queue, sys.dm_broker_connections)",
        ),
    ]


def links(routes_to: Sequence[str]) -> list[Rule]:
    """A transmitter's link to each namespace on this cluster it delivers to."""
    return [
        rule
        for other in routes_to
        for rule in (
            Rule(
                "TOPIC",
                "LITERAL",
                names.inbound_topic(other),
                ("WRITE",),
                f"a route to namespace {other}: its inbound topic",
            ),
            Rule("TOPIC", "LITERAL", names.acks_topic(other), ("READ",), f"namespace {other}'s acknowledgements"),
            Rule(
                "GROUP",
                "LITERAL",
                names.reader_group(other),
                ("DESCRIBE",),
                f"the group id reading namespace {other}'s acks",
            ),
        )
    ]


def deployer(ns: str) -> list[Rule]:
    p = names.prefix(ns)
    return [
        Rule(
            "TOPIC",
            "PREFIXED",
            p,
            ("DESCRIBE", "CREATE", "ALTER", "ALTER_CONFIGS", "DESCRIBE_CONFIGS"),
            "see, create and configure the catalog's topics; grow their partitions (ALTER)",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            names.catalog_topic(ns),
            ("READ", "WRITE"),
            "read the catalog applied before, publish the new one",
        ),
        Rule(
            "GROUP",
            "PREFIXED",
            p,
            ("DESCRIBE",),
            "whether a queue that grows has readers (its group), kbroker's readers' group",
        ),
    ]
