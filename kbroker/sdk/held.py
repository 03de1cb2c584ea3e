"""What a Service Broker transaction holds until it ends: the records its statements staged, its
own view of the conversation endpoints it changed (the rest of the process sees them once it
commits), and which endpoints it creates. What a RECEIVE's messages add to it (sort), and the
records a commit turns it into (commit_records), are here too; the transaction's locks, leases
and outcome are sdk/transaction.py's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import orjson

from kbroker.core.catalog.models import Catalog
from kbroker.core.dialogs.conversation_endpoint import Endpoint, must_persist
from kbroker.core.dialogs.envelope import Message
from kbroker.core.dialogs.groups import MOVE_MARKER, next_hop
from kbroker.core.dialogs.retained import RETAINED_MARKER
from kbroker.core.dialogs.send_lease import SendLease
from kbroker.core.records import Record
from kbroker.errors import ConversationNotFoundError
from kbroker.sdk.runtime import BrokerRuntime

VALIDATION_CODES = {"EMPTY": "E", "NONE": "N", "WELL_FORMED_XML": "X", "VALID_XML": "X", "JSON": "J"}

log = logging.getLogger("kbroker.transaction")


@dataclass(frozen=True, eq=False)
class HeldMark:
    """What a Held holds at a savepoint: how many records, and copies of the rest."""

    records: int
    endpoints: dict[str, Endpoint | None]
    unwritten: frozenset[str]
    created: frozenset[str]


class Held:
    """One transaction's held records and endpoint changes."""

    def __init__(self, runtime: BrokerRuntime):
        self._runtime = runtime
        self.records: list[Record] = []
        self.endpoints: dict[str, Endpoint | None] = {}  # this transaction's view; None = removed
        self.unwritten: set[str] = set()  # staged only by SENDs within their reserved sequence block
        self.created: set[str] = set()  # endpoints this transaction creates: their first lease goes with them

    def mark(self) -> HeldMark:
        """SAVE TRANSACTION: what is held now (records are only ever appended, so their count)."""
        return HeldMark(len(self.records), dict(self.endpoints), frozenset(self.unwritten), frozenset(self.created))

    def restore(self, mark: HeldMark) -> None:
        """ROLLBACK TRANSACTION to `mark`: the records staged since go, and the endpoints are as
        the transaction saw them then, send sequences included, so the SENDs that follow number
        on from there and the numbers of the SENDs undone are used again (none was written):
        the dialog's numbers keep no gap."""
        del self.records[mark.records :]
        self.endpoints = dict(mark.endpoints)
        self.unwritten = set(mark.unwritten)
        self.created = set(mark.created)

    def endpoint(self, handle: str) -> Endpoint:
        """The endpoint of `handle` as the transaction sees it (its own changes included);
        ConversationNotFoundError if there is none."""
        if handle in self.endpoints:
            ep = self.endpoints[handle]
            if ep is None:
                raise ConversationNotFoundError(handle)
            return ep
        return self._runtime.endpoints.current(handle)

    def stage(self, ep: Endpoint) -> None:
        """`ep` as the transaction's view of its conversation, written when it commits."""
        self.endpoints[ep.conversation_handle] = ep
        self.unwritten.discard(ep.conversation_handle)

    def stage_send(self, before: Endpoint, ep: Endpoint) -> None:
        """`ep`, the endpoint after a SEND from `before`: written when it commits only if the SEND
        left its reserved sequence block or something else staged it to be written."""
        staged_to_write = ep.conversation_handle in self.endpoints and ep.conversation_handle not in self.unwritten
        self.stage(ep)
        if not staged_to_write and not must_persist(before, ep):
            self.unwritten.add(ep.conversation_handle)  # no endpoint record for this SEND

    def remove(self, handle: str) -> None:
        """The conversation's endpoint goes when the transaction commits."""
        self.endpoints[handle] = None
        self.unwritten.discard(handle)

    def sort(self, msgs: list[Message], catalog: Catalog) -> tuple[list[Message], list[tuple[Message, str | None]]]:
        """Split what a RECEIVE took into messages to deliver and records of moved conversations
        (with the group to re-key them to; None for a move marker, which is only consumed).
        `catalog`: as the RECEIVE found it, for the arrival checks."""
        rt = self._runtime
        delivered: list[Message] = []
        moving: list[tuple[Message, str | None]] = []
        for m in msgs:
            env = m.extra["envelope"]
            staged = self.endpoints.get(m.conversation_handle)
            if env.message_type_name == MOVE_MARKER:
                ep = self._note_move(m)
                if staged is not None and ep is not None:
                    self.stage(staged.with_chain(ep.chain))
                moving.append((m, None))
                continue
            if env.message_type_name == RETAINED_MARKER:  # a sent message's copy: only consumed
                moving.append((m, None))
                continue
            ep = self._receiving_endpoint(m, staged)
            hop = next_hop(ep, env.hop)
            if hop is not None:  # checked where it is delivered (a moved one is re-keyed unread)
                moving.append((m, hop))
                continue
            # Consumed with this transaction, its dead letter and event written, never delivered:
            # refused on arrival (what SEND would have refused), or for an endpoint CLOSED here.
            aside = rt.statements.refused_record(m, ep, catalog) or rt.statements.closed_records(m, ep)
            if aside is not None:
                records, reason = aside
                log.warning("message %s on %s: %s", m.message_id, m.queue, reason)
                self.records.extend(records)
                continue
            late = rt.statements.late_records(m, ep)
            if late is not None:  # never delivered after the peer's EndDialog: said, not silent
                records, ep, reason = late
                log.warning("message %s on %s: %s", m.message_id, m.queue, reason)
                self.records.extend(records)
                self.stage(ep)
                continue
            existed = ep is not None
            keep, ep = rt.statements.after_receive(m, ep)
            if ep is not None:
                self.stage(ep)
                if not existed:  # a target's first message: nobody else has this side yet
                    self.created.add(ep.conversation_handle)
            if keep:
                mt = catalog.message_types.get(m.message_type_name)
                delivered.append(m if mt is None else replace(m, validation=VALIDATION_CODES[mt.validation]))
        return delivered, moving

    def _receiving_endpoint(self, msg: Message, staged: Endpoint | None) -> Endpoint | None:
        """This side's endpoint for a received message, if it exists yet."""
        env = msg.extra["envelope"]
        endpoints = self._runtime.endpoints
        # A dialog's first message finds no target endpoint: no need to read the topic for it.
        first_of_dialog = env.to_side == "TARGET" and env.message_sequence_number == 0 and env.hop == 0
        return staged or (
            endpoints.cached(msg.conversation_handle) if first_of_dialog else endpoints.find(msg.conversation_handle)
        )

    def _note_move(self, marker: Message) -> Endpoint | None:
        """A move marker came by: update the cached endpoint if this process missed the move."""
        endpoints = self._runtime.endpoints
        ep = endpoints.find(marker.conversation_handle)
        if ep is None:
            return None
        ep = ep.with_chain(tuple(orjson.loads(marker.body)))
        endpoints.note(marker.conversation_handle, ep)
        return ep

    def commit_records(self, locked: set[str]) -> tuple[list[Record], list[SendLease]]:
        """What the commit writes: the held records, then the endpoints to write, then the first
        SEND lease of each endpoint the transaction creates and holds (`locked`); and those
        leases."""
        rt = self._runtime
        records = list(self.records)
        for handle, ep in self.endpoints.items():
            if handle not in self.unwritten:
                records.append(rt.statements.endpoint_record(handle, ep))
        leases = [
            rt.send_leases.created(ep) for h in self.created & locked if (ep := self.endpoints.get(h)) is not None
        ]
        records.extend(rt.statements.lease_record(lease) for lease in leases)
        return records, leases

    def committed(self, leases: list[SendLease]) -> None:
        """The commit went through: the process sees the transaction's endpoints, and holds the
        SEND leases it wrote."""
        rt = self._runtime
        for handle, ep in self.endpoints.items():
            rt.endpoints.note(handle, ep, written=handle not in self.unwritten)
        for lease in leases:
            rt.send_leases.holding(lease)

    def in_doubt(self) -> None:
        """Whether the commit went through cannot be learnt: the process reads its endpoints anew."""
        for ep in self.endpoints.values():
            if ep is not None:
                self._runtime.endpoints.in_doubt(ep)
