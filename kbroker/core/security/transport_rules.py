"""The rule sets of the transport face's two roles: the installer creates an endpoint's topics,
the running endpoint only reads and writes them (acl_roles.py names the roles); and what a runner
needs to send to queues of other namespaces on the cluster (`queue@namespace`)."""

from __future__ import annotations

from collections.abc import Iterable

from kbroker.core import names
from kbroker.core.security.acl_bindings import Rule
from kbroker.core.transport.audit import AUDIT_QUEUE
from kbroker.core.transport.bridge import bridge_prefix
from kbroker.core.transport.delayed import delayed_prefix, delayed_topic
from kbroker.core.transport.endpoint import (
    ERROR_QUEUE,
    parse_address,
    transport_queue_prefix,
    transport_queue_topic,
)
from kbroker.core.transport.subscriptions import subscriptions_topic


def _endpoint_queues(ns: str, endpoint: str | None) -> list[tuple[str, str]]:
    """(pattern, name) of an endpoint's queue topics (its primary queue and every
    `Endpoint.<machine>`), or of every transport queue of the namespace."""
    if endpoint is None:
        return [("PREFIXED", transport_queue_prefix(ns))]
    primary = transport_queue_topic(ns, endpoint)
    return [("LITERAL", primary), ("PREFIXED", primary + ".")]  # a bare prefix would match `EndpointX`


def _endpoint_store(ns: str, endpoint: str | None) -> tuple[str, str]:
    """(pattern, name) of an endpoint's delayed store, or of every delayed store of the namespace."""
    return ("PREFIXED", delayed_prefix(ns)) if endpoint is None else ("LITERAL", delayed_topic(ns, endpoint))


def transport_installer(ns: str, endpoint: str | None) -> list[Rule]:
    own = _endpoint_queues(ns, endpoint)
    store_pattern, store = _endpoint_store(ns, endpoint)
    return [
        Rule(
            "TOPIC",
            pattern,
            name,
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the endpoint's queues (CREATE TABLE, VIEW DEFINITION)",
        )
        for pattern, name in own
    ] + [
        Rule(
            "TOPIC",
            "LITERAL",
            names.deadletter_topic(ns),
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the dead-letter topic poison messages go to",
        ),
        Rule(
            "TOPIC",
            store_pattern,
            store,
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the endpoint's delayed store (its Delayed table)",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            subscriptions_topic(ns),
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the namespace's subscription table",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            transport_queue_topic(ns, ERROR_QUEUE),
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the error queue failed messages go to (shared by the endpoints)",
        ),
        Rule(
            "TOPIC",
            "LITERAL",
            transport_queue_topic(ns, AUDIT_QUEUE),
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the audit queue processed messages are copied to (when the endpoint audits)",
        ),
        Rule(
            "TOPIC",
            "PREFIXED",
            bridge_prefix(ns),
            ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            "the bridge topics to other clusters (when the endpoint bridges)",
        ),
    ]


def transport_runner(ns: str, endpoint: str | None) -> list[Rule]:
    own = _endpoint_queues(ns, endpoint)
    store_pattern, store = _endpoint_store(ns, endpoint)
    return (
        [Rule("TOPIC", pattern, name, ("READ",), "receive from the endpoint's queues") for pattern, name in own]
        + [
            Rule("GROUP", pattern, name, ("READ",), "a queue's consumer group (named as its topic)")
            for pattern, name in own
        ]
        + [
            Rule(
                "TOPIC",
                "PREFIXED",
                transport_queue_prefix(ns),
                ("WRITE",),
                "send to any transport queue of the namespace",
            ),
            Rule("TOPIC", "LITERAL", names.deadletter_topic(ns), ("WRITE",), "poison messages"),
            Rule(
                "TOPIC",
                store_pattern,
                store,
                ("READ", "WRITE"),
                "delayed sends stored, due ones moved (their tombstones)",
            ),
            Rule("GROUP", store_pattern, store, ("READ",), "the delayed store's movers (named as its topic)"),
            Rule(
                "TOPIC",
                "LITERAL",
                subscriptions_topic(ns),
                ("READ", "WRITE"),
                "the subscription table: who receives a publish; subscribe and unsubscribe",
            ),
            Rule("GROUP", "LITERAL", names.reader_group(ns), ("DESCRIBE",), "kbroker's readers (the table's)"),
            Rule(
                "TOPIC",
                "PREFIXED",
                bridge_prefix(ns),
                ("READ", "WRITE"),
                "sends to queues on other clusters, written here and pushed on",
            ),
            Rule("GROUP", "PREFIXED", bridge_prefix(ns), ("READ",), "the bridges' pushers (named as their topic)"),
            Rule(
                "TRANSACTIONAL_ID",
                "PREFIXED",
                names.prefix(ns),
                ("WRITE",),
                "the group committer's transactions (a receive's removal and its handler's sends)",
            ),
        ]
    )


def sends_to(ns: str, addresses: Iterable[str]) -> list[Rule]:
    """What a runner of namespace `ns` needs to send to the queues `addresses` name in other
    namespaces of the cluster (`queue@namespace`, parse_address): WRITE on the queue's topic
    and on its `queue.<machine>` queues, where replies to that endpoint's instances come back.
    WRITE implies the DESCRIBE the send's queue look-up asks for. The same principal writes
    the topic later for a delayed send, since the sender's own instances move the row from its
    delayed store; the transactional ids of both stay under `ns`'s prefix, which
    transport_runner grants. An address of `ns` itself adds nothing: transport_runner writes
    every transport queue of `ns` already. ValueError naming an address that is not one."""
    out: list[Rule] = []
    for address in addresses:
        try:
            queue, other = parse_address(address, ns)
        except ValueError as exc:
            raise ValueError(f"transport address {address!r} is not queue or queue@namespace: {exc}") from None
        if other == ns:
            continue
        out += [
            Rule(
                "TOPIC",
                pattern,
                name,
                ("WRITE",),
                f"send to {queue}@{other} (another namespace), its delayed sends moved there, replies to it",
            )
            for pattern, name in _endpoint_queues(other, queue)
        ]
    return out
