"""The conversation lock across processes: a lease on one side of a dialog, kept on the
endpoints topic (key `<handle>/lease`).

Service Broker's SEND locks the conversation until the transaction ends, so two sessions that
send on one dialog number their messages in commit order. Processes here share no memory, so
the lock is a record: the process that holds a side's lease is the only one that may SEND, END
or set a timer on it. Kafka has no compare-and-set, so the topic decides who holds it: every
reader folds the lease records in log order with the rule below, and all agree, because the
first record that follows a given state wins and any other written from the same state is
refused. A claimant writes its claim, reads the topic up to it, and holds the lease only if its
claim was the one accepted.

A lease is taken over only once it has run out (the holder stopped renewing it: it crashed,
stopped, or lost the broker). The new holder then fences the old one's transactional ids, so a
transaction the old holder still had open can never commit after the new holder's SENDs: a
stale writer is refused, not merely outrun.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

LEASE_SUFFIX = "/lease"  # beside the endpoint's own key on the endpoints topic
WANT_SUFFIX = "/wanted"  # a process waiting for the lease says so here (see Want)

LEASE_SECONDS = 10.0  # how long a claim or renewal holds the lease without another renewal
RENEW_WITHIN = 5.0  # a holder renews when less than this is left
MARGIN = 2.0  # a holder stops using a lease this long before it runs out (clock skew, a slow commit)
# A lease no statement has used for this long is released rather than renewed. A process that
# wants a held lease does not wait for this: it says so (Want), and the holder lets it go. So
# the release only bounds the keeper's renewals of idle leases (one batched record per lease
# every LEASE_SECONDS - RENEW_WITHIN), and it is kept well above how long an application takes
# to come back to a dialog: at 5 s, a loop over 250 dialogs that took 5 s per round found every
# lease released, claimed each again (two reads and a write, ~100 ms), and so went slower still.
IDLE_RELEASE = 60.0
YIELD_BACKOFF = 0.5  # a holder that let a lease go to a waiter does not claim it back sooner
SEQUENCE_SPAN = 1024  # sequence numbers a claim or renewal lets its holder use


def lease_key(handle: str) -> str:
    return handle + LEASE_SUFFIX


def want_key(handle: str) -> str:
    return handle + WANT_SUFFIX


@dataclass(frozen=True)
class Want:
    """A process waits for the lease of `epoch`: its holder lets it go once no transaction of
    its own holds the conversation, as Service Broker's lock passes to a waiter when the
    holder's transaction ends, instead of keeping it while it stays busy. A separate key, so
    compaction never puts a want in place of the lease record."""

    handle: str
    epoch: int
    by: str

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_json(cls, raw: bytes) -> "Want":
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class SendLease:
    """One lease record. `epoch` counts claims; a renewal or release keeps it. `owner` None:
    released. `by` wrote the record. `fence`: the owner's transactional ids, which a process
    taking the lease over after it ran out fences."""

    handle: str
    epoch: int
    owner: str | None
    by: str
    until: float  # epoch seconds
    # The holder sends only sequence numbers below this; a released lease says the exact next
    # one. So whoever takes the lease next continues from the lease record alone, without
    # needing to have read the holder's endpoint records.
    ceiling: int = 0
    fence: tuple[str, ...] = ()
    # On release: the endpoint's state as its holder last knew it, so a claimant learns of an
    # END CONVERSATION with the lease even if it has not read the endpoint's record yet.
    state: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_json(cls, raw: bytes) -> "SendLease":
        d = orjson.loads(raw)
        d["fence"] = tuple(d.get("fence") or ())
        return cls(**d)

    def free_for(self, process: str, now: float) -> bool:
        """Whether `process` may claim it now: released, run out, or its own."""
        return self.owner is None or self.owner == process or self.until <= now

    def held_by(self, process: str, now: float) -> bool:
        """Whether `process` may use it now (with the margin before it runs out)."""
        return self.owner == process and self.until - MARGIN > now

    # --- the records a process writes ----------------------------------------------------------

    def claimed(self, process: str, now: float, fence: tuple[str, ...], start: int) -> "SendLease":
        """Taken by `process`, whose SENDs start at `start` (at least this record's ceiling)."""
        return SendLease(
            self.handle, self.epoch + 1, process, process, now + LEASE_SECONDS, start + SEQUENCE_SPAN, fence
        )

    def renewed(self, now: float, next_sequence: int, fence: tuple[str, ...]) -> "SendLease":
        return SendLease(
            self.handle,
            self.epoch,
            self.owner,
            self.by,
            now + LEASE_SECONDS,
            max(self.ceiling, next_sequence + SEQUENCE_SPAN),
            fence,
        )

    def released(self, now: float, next_sequence: int, state: str | None) -> "SendLease":
        return SendLease(self.handle, self.epoch, None, self.by, now, next_sequence, (), state)

    def needs_renewal(self, now: float, next_sequence: int, within: float = RENEW_WITHIN) -> bool:
        """Whether the sequence block is used up or under `within` seconds of the lease are left."""
        return self.until - now < within or next_sequence >= self.ceiling

    def must_renew_now(self, now: float, next_sequence: int) -> bool:
        """Whether a statement renews the lease itself before using it: its sequence block is
        used up, or the keeper fell behind (it renews every lease within RENEW_WITHIN of its
        end, all in one write and read, every KEEP_EVERY) and under half of that is left. A
        statement renewing on the keeper's behalf cost each a write and a read of the topic,
        one after another: 64 readers renewing at once stalled every conversation for seconds."""
        return self.needs_renewal(now, next_sequence, RENEW_WITHIN / 2)


def first_claim(handle: str, process: str, now: float, fence: tuple[str, ...], start: int = 0) -> SendLease:
    """The lease a side starts with: for a new endpoint (BEGIN DIALOG, a target's first
    message) written in the transaction that creates it, when nobody else knows the handle yet;
    for an endpoint written before leases, claimed like any other."""
    return SendLease(handle, 1, process, process, now + LEASE_SECONDS, start + SEQUENCE_SPAN, fence)


def folded(current: SendLease | None, new: SendLease) -> SendLease | None:
    """The lease after record `new`, given the accepted one (`current`), or None when `new` is
    refused. A claim is accepted when it is the next epoch; a renewal or release only from the
    holder of the current epoch. So of two claims written from the same state, the first in
    the log wins, and a holder whose lease was taken over can no longer renew or release it.
    With no current record (the first one, or compaction kept only the last) the record stands."""
    if current is None:
        return new
    if new.epoch == current.epoch + 1 and new.owner == new.by:
        return new
    if new.epoch == current.epoch and current.owner is not None and current.owner == new.by:
        return new
    return None
