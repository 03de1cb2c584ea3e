"""Where an endpoint's SENDs continue: the sequence-number rules of the endpoints cache (pure).

A SEND writes its endpoint's record only once per reserved block of sequence numbers
(endpoint.after_send), so the topic does not always say the exact next number. The cache of
kafka/dialogs/conversation_endpoints.py keeps, per endpoint, the highest reservation this process made, the
exact state where the topic falls short of it, and the floor a lease this process took sets;
these functions decide from them what number the next SEND gets, what a record read back means,
and what a release, a clean close or a transaction in doubt leaves. Whatever a crash leaves, a
number may be skipped (a gap), never used twice.
"""

from __future__ import annotations

from dataclasses import replace

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.core.dialogs.send_lease import SendLease


def keeps_exact(ep: Endpoint, written: bool) -> bool:
    """Whether the cache must keep `ep` as the exact state for a clean close: the topic does not
    say its exact next sequence. So for a SEND within the reserved block (not written), and for
    a written record that reserved a block not used up yet (the first SEND of a dialog writes its
    state change with the block; without this a second process continued past the whole block,
    sequence 65 after 0)."""
    return not written or ep.sequence_reserved > ep.send_sequence


def reservation_after(mine: int | None, ep: Endpoint) -> int:
    """The highest sequence reservation this process made, once it wrote (or noted) `ep`."""
    return max(-1 if mine is None else mine, ep.sequence_reserved)


def continued(ep: Endpoint, mine: int | None, exact: Endpoint | None, floor: int) -> Endpoint:
    """An endpoint read from the topic: where its SENDs continue. A record this process wrote
    (its reservation is not above `mine`, the latest this process made) continues at the exact
    count this process keeps (`exact`); anyone else's record continues past the block it
    reserved, since SENDs within that block were not written. Never below `floor`, where a lease
    this process took says its SENDs start."""
    if mine is not None and ep.sequence_reserved <= mine:
        seq = max(ep.send_sequence, exact.send_sequence if exact is not None else 0)
    else:
        seq = max(ep.send_sequence, ep.sequence_reserved)
    seq = max(seq, floor)
    return ep if seq == ep.send_sequence else replace(ep, send_sequence=seq)


def past_doubt(known: Endpoint, ep: Endpoint) -> Endpoint:
    """`known` after a transaction that wrote `ep` (or SENT within its block) may or may not have
    committed: its SENDs' numbers may be taken either way, so the next SEND goes on past
    everything either reserved and writes a new block, as after a crash (a gap at worst, never
    a number used twice). The state stays as known."""
    past = max(ep.send_sequence, ep.sequence_reserved, known.send_sequence, known.sequence_reserved)
    return replace(known, send_sequence=past, sequence_reserved=past)


def block_released(ep: Endpoint) -> Endpoint:
    """The record that gives back the unused rest of `ep`'s reserved block: it says the exact
    next sequence (written at a clean close, or before another process takes the lease)."""
    return replace(ep, sequence_reserved=ep.send_sequence)


def advanced(ep: Endpoint, start: int) -> Endpoint | None:
    """`ep` once this process took its lease, whose record says SENDs go on at `start`; None
    when `ep` is already there."""
    if ep.send_sequence >= start:
        return None
    return replace(ep, send_sequence=start, sequence_reserved=max(ep.sequence_reserved, start))


def claim_start(ep: Endpoint, lease: SendLease | None) -> int:
    """Where a process taking a side's lease starts its SENDs (`ep` as this process has read it,
    `lease` the record it claims after; None: nobody ever held it). A release says the exact next
    sequence, and its holder sends nothing after it, so the release decides even when `ep` says
    more: a record of the holder's that reserved a block continues past that block (`continued`),
    and the exact record the holder wrote before releasing may sit in another partition of the
    endpoints topic, not read as far yet (two processes taking turns on a loaded machine left a
    gap of 60 so). A lease that ran out decides nothing exactly: past everything either says."""
    if lease is None:
        return max(ep.send_sequence, ep.sequence_reserved)
    if lease.owner is None:
        return lease.ceiling
    return max(ep.send_sequence, lease.ceiling)
