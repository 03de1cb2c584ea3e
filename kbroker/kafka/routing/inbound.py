"""What a message read from the inbound topic becomes (kafka/routing/dispatcher.py): its records on
its queue, or, for a service this namespace does not host, its next hop and what the forwarder holds
of it. Pure functions of the message and the catalog, apart from the dispatcher's transactions.
"""

from __future__ import annotations

from confluent_kafka import Message

from kbroker.core import names
from kbroker.core.catalog.models import Catalog
from kbroker.core.dialogs.envelope import H_FOLLOWS, H_PRIORITY, Envelope
from kbroker.core.dialogs.timers import target_lifetime_record
from kbroker.core.records import Header, Record
from kbroker.core.routing.forwarding import Forwarded
from kbroker.core.routing.routes import hop, match_route, routes_of
from kbroker.kafka import messages


def queue_records(
    namespace: str, env: Envelope, msg: Message, catalog: Catalog, opened: tuple[bytes, list[Header]] | None = None
) -> list[Record]:
    """The records that save `msg` to its service's queue (and a target's lifetime timer);
    `opened`: its clear value and headers when it came sealed (kafka/routing/sealing.py)."""
    queue = catalog.services[env.to_service_name].queue
    topic = names.queue_topic(namespace, queue)
    value, headers = opened if opened is not None else (messages.value(msg), messages.headers(msg))
    hs = [(n, v) for n, v in headers if n != H_FOLLOWS]  # the hop's own declaration
    # RECEIVE here orders by the receiving endpoint's priority, from this namespace's priorities;
    # with none matching, the sender's (its SEND's, or its side's) stays.
    mine = catalog.endpoint_priority(env.service_contract_name, env.to_service_name, env.from_service_name)
    if mine is not None:
        hs = [(n, str(mine).encode() if n == H_PRIORITY else v) for n, v in hs]
    out: list[Record] = [(topic, env.conversation_group_id, value, hs)]
    if env.to_side == "TARGET" and env.message_sequence_number == 0 and env.lifetime is not None:
        out.append(target_lifetime_record(namespace, env, topic))
    return out


def next_hop(catalog: Catalog, env: Envelope, here: str, now: float) -> str | None:
    """Where a message for a service this namespace (`here`) does not host goes next, by this
    namespace's routes (`<bootstrap>/<namespace>`), or None: it waits at its sender."""
    route = match_route(routes_of(catalog), env.to_service_name, env.to_broker, now)
    nxt = None if route is None else hop(route, env.to_service_name, here)
    return None if nxt == here else nxt


def forwarded(env: Envelope, msg: Message, destination: str, now: float) -> Forwarded:
    """What the forwarder holds of `msg`, bound for `destination` (its next hop)."""
    value, headers = messages.value(msg), messages.headers(msg)
    assert env.from_broker is not None  # the dispatcher refused a message without one
    return Forwarded(
        env.message_id,
        env.conversation_id,
        env.to_side == "TARGET",
        env.to_service_name,
        env.from_service_name,
        env.from_broker,
        destination,
        env.message_sequence_number,
        len(value),
        now,
        record=(messages.key(msg).decode(errors="replace"), value, headers),
    )
