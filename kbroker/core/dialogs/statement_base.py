"""What the statement builders share: the catalog look-up they read through, the dead-letter event
a refused message gets, the conversation group argument's form, and the base of Statements (its
namespace, the topics of a conversation's sides, the endpoints-topic records)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

import orjson

from kbroker.core import names
from kbroker.core.catalog.models import Catalog
from kbroker.core.dead_letter import ConsumedRecord
from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.dialogs.groups import parse_group
from kbroker.core.dialogs.send_lease import SendLease, lease_key
from kbroker.core.records import Record
from kbroker.errors import CatalogError, InvalidArgumentError

# The Error code kbroker sends back for a message that arrived after its sender's side had ended
# the dialog (kbroker's own: negative like Service Broker's broker errors, outside their range).
MESSAGE_AFTER_END = -9601
CURRENT_DATABASE = "CURRENT DATABASE"  # BEGIN DIALOG ... TO SERVICE 's', 'CURRENT DATABASE'

T = TypeVar("T")

DEAD_LETTERED = "MESSAGE_DEAD_LETTERED"  # the event beside each dead letter a RECEIVE writes (G8)


def dead_letter_event(namespace: str, queue: str, record: ConsumedRecord, reason: str, now: float) -> Record:
    """The event that says a message of `queue` was dead-lettered on RECEIVE, and why, on the
    namespace's events topic (keyed by the queue, as its other events are): written in the
    transaction of the dead letter, so each such dead letter has exactly one."""
    event = {
        "event": DEAD_LETTERED,
        "queue": queue,
        "topic": record.topic(),
        "partition": record.partition(),
        "offset": record.offset(),
        "reason": reason,
        "time": int(now * 1000),
    }
    return (names.events_topic(namespace), queue, orjson.dumps(event), None)


class Lookup(Protocol):
    """A catalog look-up: calls `fn` with the catalog and, when it raises CatalogError, once more
    with a freshly read catalog before letting the error through."""

    def __call__(self, fn: Callable[[Catalog], T]) -> T: ...


def first_in(catalog: Catalog, lookup: Lookup) -> Lookup:
    """A look-up in `catalog`, falling back to `lookup` for an object `catalog` does not know."""

    def first(fn: Callable[[Catalog], T]) -> T:
        try:
            return fn(catalog)
        except CatalogError:
            return lookup(fn)

    return first


def group_id(value: object) -> str:
    """A conversation group argument in its canonical form; InvalidArgumentError if no GUID."""
    try:
        return parse_group(value)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


class StatementBase:
    """A namespace's statement builders' common part (see Statements for the arguments)."""

    def __init__(
        self,
        namespace: str,
        lookup: Lookup,
        in_group: Callable[[str], Iterable[Endpoint]],
        *,
        clock: Callable[[], float] = time.time,
        sender_reach: Callable[[str, int], int | None] = lambda handle, sequence: None,
    ):
        self.namespace = namespace
        self._lookup = lookup
        self._in_group = in_group
        self._clock = clock
        self._sender_reach = sender_reach
        self.endpoints_topic = names.endpoints_topic(namespace)
        # A routed dialog's record -> its body sealed for the transmission topic and the header
        # saying so, or None (kept in clear): set by the SDK (kafka/routing/sealing.py).
        self.transmission_seal: Callable[[Envelope, bytes], tuple[bytes, tuple[str, bytes]] | None] | None = None

    # --- topics ---------------------------------------------------------------------------------

    def own_topic(self, ep: Endpoint) -> str:
        """The topic this side of a conversation receives from."""
        return self.queue_topic_of(ep.service_name, ep.instance)

    def endpoint_priority(self, contract: str, local: str, remote: str) -> int:
        """The priority a new endpoint gets from the broker priorities (5 when none matches)."""
        found = self._lookup(lambda c: c.endpoint_priority(contract, local, remote))
        return 5 if found is None else int(found)

    def queue_of(self, service: str) -> str:
        """The queue of `service`."""
        return self._lookup(lambda c: c.service(service)).queue

    def queue_topic_of(self, service: str, instance: str | None) -> str:
        """Where messages for `service` land: its queue, or that queue's secondary queue."""
        queue = self.queue_of(service)
        if instance is not None:
            return names.secondary_queue_topic(self.namespace, queue, instance)
        return names.queue_topic(self.namespace, queue)

    # --- the endpoints topic ----------------------------------------------------------------------

    def lease_record(self, lease: SendLease) -> Record:
        """The endpoints-topic record of a side's conversation lease (send_lease.py)."""
        return (self.endpoints_topic, lease_key(lease.handle), lease.to_json(), None)

    def endpoint_record(self, handle: str, ep: Endpoint | None) -> Record:
        """The endpoints-topic record of `handle` (None: its tombstone)."""
        return (self.endpoints_topic, handle, None if ep is None else ep.to_json(), None)
