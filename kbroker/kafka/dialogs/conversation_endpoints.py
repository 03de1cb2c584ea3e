"""The endpoints topic as a read-through cache: each process keeps the endpoints it has read or
written and reads the compacted topic forward only for a handle it does not know.

Bounded by the live conversations: an endpoint CLOSED for longer than the grace period (30
minutes, as long as Service Broker keeps a target's closed endpoint) is not kept, whether it is
read that old or grows that old in the cache, and the worker writes its tombstone
(kafka/receive/reclaim.reclaim_endpoints). Endpoints are indexed by conversation group, so the related-
group checks of BEGIN DIALOG and MOVE look at that group's endpoints only."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from confluent_kafka import Message, Producer

from kbroker import config
from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.conversation_endpoint import (
    CHAIN_SUFFIX,
    CLOSED,
    CLOSED_GRACE_SECONDS,
    Endpoint,
    merged_state,
)
from kbroker.core.dialogs.endpoint_records import endpoint_record
from kbroker.core.dialogs.send_lease import LEASE_SUFFIX, WANT_SUFFIX, SendLease, Want, folded
from kbroker.core.dialogs.send_sequence import (
    advanced,
    block_released,
    continued,
    keeps_exact,
    past_doubt,
    reservation_after,
)
from kbroker.core.rejected import Rejected
from kbroker.errors import BrokerUnavailableError, ConversationNotFoundError
from kbroker.kafka.dialogs.forward_reader import ForwardReader
from kbroker.kafka.dialogs.spill import SpillMap, SpillStore
from kbroker.kafka.rejects import Rejects

log = logging.getLogger("kbroker.endpoints")

READ_TIMEOUT = 60.0  # seconds a read of the topic may take (the first one reads all of it)
FRESH_FOR = 1.0  # seconds a statement that changes an endpoint trusts the last read of the topic

# How a CLOSED endpoint's record says so (compact JSON; a quote inside a name is escaped, so the
# bytes cannot occur anywhere else): what lets a reader skip reclaimed endpoints unparsed.
CLOSED_JSON = f'"state":"{CLOSED}"'.encode()
_OTHER_KEYS = tuple(s.encode() for s in (CHAIN_SUFFIX, LEASE_SUFFIX, WANT_SUFFIX))  # not an endpoint's own


class EndpointStore:
    """Read-through cache over the compacted endpoints topic.

    A moved endpoint's group chain is also kept under its own key (`<handle>/groups`), written
    only by MOVE CONVERSATION. Any process may write an endpoint from a cache that predates a
    move made elsewhere (last writer wins); the chain key, merged in on every read, keeps the
    move from being undone, even after compaction has dropped the endpoint record that had it.
    """

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        producer: Producer | None,
        *,
        continue_sequences: bool = True,
        hot_endpoints: int | None = None,
    ):
        # producer None: a store that only reads (views, the reclaim): see read_endpoints.
        # continue_sequences=False: show records as written (views), not where SENDs would go on.
        self._continue_sequences = continue_sequences
        self.topic = names.endpoints_topic(namespace)
        self._producer = producer
        # Every map keyed by handle (or group) keeps its last `hot` entries in memory and the rest
        # in the store's private database (spill.py): memory bounded whatever the dialogs.
        self._spill = SpillStore()
        spill, hot = self._spill, hot_endpoints or config.hot_endpoints()
        self._cache: SpillMap[Endpoint] = SpillMap(spill, "endpoints", hot)
        self._by_group: SpillMap[tuple[str, ...]] = SpillMap(spill, "groups", hot)  # group -> handles
        # CLOSED endpoints in the cache: when they closed (epoch seconds)
        self._closed_at: SpillMap[float] = SpillMap(spill, "closed_at", hot, ordered=True)
        self.grace = CLOSED_GRACE_SECONDS
        self._pruned = time.monotonic()
        # The exact state of endpoints whose next sequence the topic does not say (a block
        # reserved and not used up): written at a clean close, so the next process goes on exactly.
        self._unwritten: SpillMap[Endpoint] = SpillMap(spill, "unwritten", hot)
        self._mine: SpillMap[int] = SpillMap(spill, "mine", hot)  # the highest sequence reservation made here
        self._chains: SpillMap[tuple[str, ...]] = SpillMap(spill, "chains", hot)
        self._leases: SpillMap[SendLease] = SpillMap(spill, "leases", hot)  # each side's conversation lock
        self._wants: SpillMap[Want] = SpillMap(spill, "wants", hot)  # the last process waiting for each lease
        self._floor: SpillMap[int] = SpillMap(spill, "floor", hot)  # where a lease taken here says SENDs start
        self._reader = ForwardReader(Cluster.of(cluster), namespace, self.topic, self._apply, self._prune)
        self.fresh_for = FRESH_FOR
        # A record that is not an endpoint's is skipped and logged here; the worker's 5th-tick
        # scan records it (every process reads this topic whole: see kafka/rejects.py).
        self.rejects = Rejects(cluster, namespace, "endpoint cache", record=False, scanned=True)

    def put(self, ep: Endpoint) -> None:
        """Queue the new state; it is durable when the shared producer is flushed."""
        assert self._producer is not None, "a read-only endpoint store does not write"
        ep = replace(ep, updated=time.time())
        self._keep_exact(ep.conversation_handle, ep, written=True)
        self._claim(ep)
        self._remember(self._merged(ep), time.time())
        self._producer.produce(self.topic, key=ep.conversation_handle, value=ep.to_json())

    def note(self, handle: str, ep: Endpoint | None, written: bool = True) -> None:
        """Cache state a committed Kafka transaction already wrote (None: the endpoint is gone).
        written=False: a SEND within the reserved sequence block, kept here until close()."""
        self._keep_exact(handle, ep, written)
        if ep is not None:
            self._claim(ep)
        if ep is None:
            self._forget(handle)
            self._chains.pop(handle, None)
        else:
            if ep.group_chain:
                self._chains[handle] = ep.with_chain(self._chains.get(handle, ())).chain
            self._remember(self._merged(ep), time.time())

    def in_doubt(self, ep: Endpoint) -> None:
        """A transaction that wrote `ep` (or SENT within its block) may or may not have
        committed. Its SENDs' sequence numbers may be taken either way, so the next SEND here
        goes on past everything `ep` reserved and writes a new block, as after a crash: a gap
        at worst, never a number used twice. The state stays as known: if the transaction did
        commit a state change, that record moves the state forward when it is read."""
        handle = ep.conversation_handle
        known = self._cache.get(handle)
        if known is None:
            return
        moved_on = past_doubt(known, ep)
        self._cache[handle] = moved_on
        # Kept as this process's exact count: a record of the doubtful transaction read later
        # (this process's reservation) continues from here, not from what that record says.
        self._unwritten[handle] = moved_on
        self._mine[handle] = reservation_after(self._mine.get(handle), moved_on)

    def _keep_exact(self, handle: str, ep: Endpoint | None, written: bool) -> None:
        """Keep the exact state for close() wherever the topic does not say the exact next
        sequence (core/dialogs/send_sequence.keeps_exact)."""
        if ep is not None and keeps_exact(ep, written):
            self._unwritten[handle] = ep
        else:
            self._unwritten.pop(handle, None)

    def _continued(self, ep: Endpoint) -> Endpoint:
        """An endpoint read from the topic: where its SENDs continue (core/dialogs/send_sequence.continued)."""
        handle = ep.conversation_handle
        return continued(ep, self._mine.get(handle), self._unwritten.get(handle), self._floor.get(handle, 0))

    def _claim(self, ep: Endpoint) -> None:
        self._mine[ep.conversation_handle] = reservation_after(self._mine.get(ep.conversation_handle), ep)

    def write_unwritten(self) -> int:
        """On a clean close: write the exact next sequence of every endpoint that SENT within its
        reserved block, releasing the rest of the block, so a restart continues without a gap."""
        n = 0
        for ep in list(self._unwritten.values()):
            self.put(block_released(ep))
            n += 1
        return n

    def _remember(self, ep: Endpoint, written_at: float) -> None:
        """Cache `ep` (written at `written_at`, epoch seconds) and index it by its group, unless
        it would move the endpoint's state back (core/endpoint.merged_state): then it is a
        stale writer's, and refused."""
        handle = ep.conversation_handle
        old = self._cache.get(handle)
        merged = merged_state(old, ep)
        if merged is None:
            log.info(
                "endpoint %s: a record in state %s written from a stale copy is refused (the endpoint is %s)",
                handle,
                ep.state,
                old.state if old else None,
            )
            return
        ep = merged
        if old is not None and old.conversation_group_id != ep.conversation_group_id:
            self._unindex(handle, old.conversation_group_id)
        self._cache[handle] = ep
        group = ep.conversation_group_id
        handles = self._by_group.get(group, ())
        if handle not in handles:
            self._by_group[group] = (*handles, handle)
        if ep.state == CLOSED:
            self._closed_at.setdefault(handle, written_at)
        else:
            self._closed_at.pop(handle, None)

    def _forget(self, handle: str) -> None:
        self._leases.pop(handle, None)
        self._wants.pop(handle, None)
        self._floor.pop(handle, None)
        ep = self._cache.pop(handle, None)
        if ep is not None:
            self._unindex(handle, ep.conversation_group_id)
        self._closed_at.pop(handle, None)

    def _unindex(self, handle: str, group: str) -> None:
        handles = self._by_group.get(group)
        if handles is not None and handle in handles:
            left = tuple(h for h in handles if h != handle)
            if left:
                self._by_group[group] = left
            else:
                self._by_group.pop(group)

    def _prune(self, now: float) -> None:
        """Drop endpoints CLOSED for longer than the grace period (at most once a minute)."""
        if time.monotonic() - self._pruned < 60.0:
            return
        self._pruned = time.monotonic()
        for handle in self._closed_at.below(now - self.grace + 1e-9):
            self._forget(handle)

    def in_group(self, group: str) -> list[Endpoint]:
        """The endpoints of conversation group `group` (read forward first)."""
        self._read_forward()
        self._caught_up()
        return [self._cache[h] for h in self._by_group.get(group, ())]

    def _merged(self, ep: Endpoint) -> Endpoint:
        chain = self._chains.get(ep.conversation_handle)
        return ep if chain is None else ep.with_chain(chain)

    def cached(self, handle: str) -> Endpoint | None:
        return self._cache.get(handle)

    def find(self, handle: str) -> Endpoint | None:
        ep = self._cache.get(handle)
        if ep is None:
            self._read_forward()
            ep = self._cache.get(handle)
            if ep is None:
                self._caught_up()
        return ep

    def get(self, handle: str) -> Endpoint:
        ep = self.find(handle)
        if ep is None:
            raise ConversationNotFoundError(handle)
        return ep

    def current(self, handle: str) -> Endpoint:
        """The endpoint as the statements that change it need it (SEND, END CONVERSATION, ...):
        read forward first when the last read is more than `fresh_for` seconds old, so a
        process sees within about that long that another process of its side ended the dialog
        (the statement then raises ConversationClosedError). Inside that window the receiving
        side refuses what a stale copy sends (docs/endpoints.md)."""
        if time.monotonic() - self._reader.read_at > self.fresh_for:
            self._read_forward()
        return self.get(handle)

    def all(self) -> list[Endpoint]:
        self._read_forward()
        self._caught_up()
        return list(self._cache.values())

    def refresh(self) -> None:
        """Catch up with the topic: endpoints changed by other processes (a MOVE) replace stale
        cached ones. Called when a queue partition is assigned to this process, by the timer
        service before it decides which sides a due timer reaches, and for a lease claim's answer."""
        self._read_forward()

    def caught_up(self, timeout: float) -> None:
        """Read the topic to its end within `timeout` seconds, or BrokerUnavailableError: before
        the records of a group another process held are handed out again (its transaction may
        have moved or ended their conversation)."""
        self._read_forward(timeout)
        self._caught_up(timeout)

    def _read_forward(self, timeout: float = READ_TIMEOUT) -> None:
        """Read the topic forward (ForwardReader.read: callers queued behind one read share the next)."""
        self._reader.read(timeout)

    def _caught_up(self, timeout: float = READ_TIMEOUT) -> None:
        """After a read (of `timeout` seconds at most): a handle not found, or a list of all, is
        only an answer if the read reached the end (a huge topic or a slow broker may stop it at
        the deadline)."""
        if self._reader.behind:
            raise BrokerUnavailableError(f"{self.topic} was not read to its end in {timeout:g} s; try again")

    def _apply(self, msg: Message, now: float) -> None:
        key, value = msg.key(), msg.value()
        if key is None:
            return  # not an endpoint record (a compacted topic refuses keyless ones anyway)
        if (
            value is not None
            and not key.endswith(_OTHER_KEYS)
            and CLOSED_JSON in value
            and msg.timestamp()[1] / 1000.0 <= now - self.grace
        ):
            self._forget(key.decode(errors="replace"))  # reclaimed: as good as its tombstone (not parsed)
            return
        try:
            kind, handle, decoded = endpoint_record(msg.key(), value)
        except Rejected as exc:  # skipped; recorded once by the worker's 5th-tick scan, not per process
            self.rejects.reject(msg, exc.reason)
            return
        if kind == "chain":
            self._read_chain(handle, decoded)
        elif kind == "lease":
            self._read_lease(handle, decoded)
        elif kind == "want":
            if decoded is None:
                self._wants.pop(handle, None)
            else:
                self._wants[handle] = decoded
        elif decoded is not None:
            ep = self._continued(decoded) if self._continue_sequences else decoded
            self._remember(self._merged(ep), msg.timestamp()[1] / 1000.0)
        else:
            self._forget(handle)

    def _read_chain(self, handle: str, chain: tuple[str, ...] | None) -> None:
        if chain is None:
            self._chains.pop(handle, None)
            return
        if len(chain) > len(self._chains.get(handle, ())):
            self._chains[handle] = chain
        if handle in self._cache:
            self._remember(self._merged(self._cache[handle]), time.time())

    def _read_lease(self, handle: str, new: SendLease | None) -> None:
        if new is None:
            self._leases.pop(handle, None)
            return
        accepted = folded(self._leases.get(handle), new)
        if accepted is None:
            log.debug("lease of %s: %s's record of epoch %d is refused", handle, new.by, new.epoch)
        else:
            self._leases[handle] = accepted

    def wanted(self, handle: str) -> Want | None:
        """The last process that said it waits for `handle`'s lease (as of the last read)."""
        return self._wants.get(handle)

    def lease(self, handle: str) -> SendLease | None:
        """The conversation lock of `handle` as of the last read (read_forward() first)."""
        return self._leases.get(handle)

    def advance(self, handle: str, start: int, state: str | None = None) -> None:
        """This process took `handle`'s lease, whose record says SENDs go on at `start` (and,
        if released, the state its last holder knew): no record read later (an older one, or
        one behind another process's open transaction) moves the endpoint back below that."""
        self._floor[handle] = max(self._floor.get(handle, 0), start)
        ep = self._cache.get(handle)
        if ep is not None and state is not None and state != ep.state:
            ep = merged_state(ep, replace(ep, state=state)) or ep
            self._cache[handle] = ep
        moved = None if ep is None else advanced(ep, start)
        if moved is not None:
            self._cache[handle] = moved
            self._unwritten[handle] = moved
        self._mine[handle] = max(self._mine.get(handle, -1), start)

    def flush(self, timeout: float) -> None:
        assert self._producer is not None, "a read-only endpoint store does not write"
        if self._producer.flush(timeout):
            raise BrokerUnavailableError(f"endpoint records were not acknowledged in {timeout:g} s")

    def write_exact(self, handle: str) -> None:
        """Before this process lets another have the dialog's lease: write the exact next
        sequence if SENDs within the reserved block left the topic short of it."""
        ep = self._unwritten.get(handle)
        if ep is not None:
            self.put(block_released(ep))

    def spill_counts(self) -> dict[str, int]:
        """What the cache keeps (entries in memory and on disk, over all its maps) and how often
        it moved an entry to disk and read one back (a miss of the memory tier)."""
        maps = [m for m in vars(self).values() if isinstance(m, SpillMap)]
        on_disk = sum(len(m) for m in maps) - sum(m.in_memory for m in maps)
        return {
            "in_memory": sum(m.in_memory for m in maps),
            "on_disk": on_disk,
            "spilled": sum(m.spilled for m in maps),
            "read_back": sum(m.read_back for m in maps),
        }

    def close(self) -> None:
        """Close the reading consumer and the cache's database (the shared producer is its owner's)."""
        self._reader.close()
        self._spill.close()


def read_endpoints(cluster: ClusterLike, namespace: str, *, as_written: bool = False) -> list[Endpoint]:
    """Every endpoint of the namespace, read once by a store of its own that writes nothing.
    as_written: sequences as the records say them (the views), not where SENDs would go on."""
    store = EndpointStore(cluster, namespace, None, continue_sequences=not as_written)
    try:
        return store.all()
    finally:
        store.close()
