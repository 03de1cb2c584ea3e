"""The conversation group lock across processes: a hold on a group, kept on the namespace's holds
topic (one partition, so every process folds one total order of its records).

Within a process the group lock is the queue receiver's (group_lock.py). Across processes, a
group's RECEIVE and GET CONVERSATION GROUP run only where its partition of the queue topic is
read, so that process, the partition's owner, decides: a process that runs a statement on a
conversation of a group it cannot RECEIVE from claims a hold on the group, and the owner grants
it once no transaction of its own holds the group, then keeps the group locked for the holder
until the hold is released or runs out. Where no process reads the partition, the claimant takes
the hold itself; the next owner, which reads this topic to its end before it serves the
partition, finds it.

Records, and when a reader accepts one (`fold`):

- `own` / `disown`: the partition's owner. An `own` of the next epoch is a new owner (the
  queue's consumer group moved the partition; Kafka's generations keep two readers from owning
  it at once); an `own` of the current epoch by its owner renews it; `disown` by the owner
  gives the partition up.
- `claim`: a process asks for the group, at the hold's next epoch (or any epoch when no hold is
  known). `grant`: the partition's current owner gives it the claim's epoch. `take`: a claim
  that is its own grant, accepted only if the partition's owner record is still the one its
  writer saw (`over`, -1 for none): no owner, or one whose record ran out.
- `renew`, `release`: the holder's, for its epoch. `want`: someone waits for the group; the
  holder releases it once no transaction of its own holds it. Not a state change.

A record about a hold or an owner nobody knows stands as written (a reader that started after
its first records). Entries whose `until` lies PRUNE_AFTER seconds before the newest record's
time are forgotten, the same at every reader, since the times are the records' own; a process
starts reading at READ_BACK seconds ago, so what it never saw is what the others forget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import orjson

HOLD_SECONDS = 10.0  # a claim, grant or renewal holds this long without another renewal
RENEW_WITHIN = 5.0  # a holder renews when less than this is left
MARGIN = 2.0  # a holder stops using a hold this long before it runs out (clock skew, a slow commit)
IDLE_RELEASE = 10.0  # a hold no transaction has used for this long is released
PRUNE_AFTER = 30.0
READ_BACK = 60.0  # > PRUNE_AFTER + HOLD_SECONDS: see the module's last paragraph


class MalformedHoldRecord(ValueError):
    """A record on the holds topic that is not one kbroker writes: it holds nothing."""


KINDS = ("own", "disown", "claim", "grant", "take", "renew", "release", "want")


@dataclass(frozen=True)
class HoldRecord:
    """One record of the holds topic. `group` is None for `own` / `disown`."""

    kind: str
    queue: str
    instance: str | None
    partition: int
    by: str
    at: float  # the writer's clock when it wrote the record
    group: str | None = None
    epoch: int = 0
    until: float = 0.0
    to: str | None = None  # grant: the claimant
    over: int = -1  # take: the owner record's epoch its writer saw

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_json(cls, raw: bytes) -> "HoldRecord":
        """MalformedHoldRecord for anything but a record this module writes."""
        try:
            d = orjson.loads(raw)
            rec = cls(**d)
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise MalformedHoldRecord(f"not a group hold record: {exc}") from None
        if (
            rec.kind not in KINDS
            or not isinstance(rec.queue, str)
            or not isinstance(rec.by, str)
            or not isinstance(rec.partition, int)
            or not isinstance(rec.epoch, int)
            or not isinstance(rec.over, int)
            or not all(isinstance(v, (int, float)) for v in (rec.at, rec.until))
            or not isinstance(rec.instance, (str, type(None)))
            or not isinstance(rec.to, (str, type(None)))
            or (rec.group is None) != (rec.kind in ("own", "disown"))
            or (rec.group is not None and not isinstance(rec.group, str))
        ):
            raise MalformedHoldRecord(f"not a group hold record: {d!r:.200}")
        return rec

    @property
    def partition_key(self) -> tuple[str, str | None, int]:
        return (self.queue, self.instance, self.partition)

    @property
    def group_key(self) -> tuple[str, str | None, str]:
        assert self.group is not None
        return (self.queue, self.instance, self.group)


@dataclass(frozen=True)
class Owner:
    owner: str
    epoch: int
    until: float

    def live(self, now: float) -> bool:
        return self.until > now


@dataclass(frozen=True)
class Hold:
    """A group's hold: `holder` claimed it at `epoch`; `granted` once the owner gave it (or it
    took it); `partition`: the group's partition of the queue topic."""

    holder: str
    epoch: int
    granted: bool
    until: float
    partition: int

    def live(self, now: float) -> bool:
        return self.until > now

    def usable_by(self, process: str, now: float) -> bool:
        return self.granted and self.holder == process and self.until - MARGIN > now


PartitionKey = tuple[str, str | None, int]
GroupKey = tuple[str, str | None, str]


class HoldBook:
    """The state every reader folds from the holds topic: owners and holds."""

    def __init__(self) -> None:
        self.owners: dict[PartitionKey, Owner] = {}
        self.holds: dict[GroupKey, Hold] = {}
        self._pruned_at = 0.0

    def owner(self, key: PartitionKey) -> Owner | None:
        return self.owners.get(key)

    def hold(self, key: GroupKey) -> Hold | None:
        return self.holds.get(key)

    def fold(self, rec: HoldRecord) -> bool:
        """Apply `rec`; whether it was accepted (a `want` always is: it changes nothing)."""
        self._prune(rec.at)
        if rec.kind in ("own", "disown"):
            return self._fold_owner(rec)
        if rec.kind == "want":
            return True
        key = rec.group_key
        cur = self.holds.get(key)
        accepted, new = _folded_hold(cur, rec, self.owners.get(rec.partition_key))
        if not accepted:
            return False
        if new is None:
            self.holds.pop(key, None)
        else:
            self.holds[key] = new
        return True

    def _fold_owner(self, rec: HoldRecord) -> bool:
        key = rec.partition_key
        cur = self.owners.get(key)
        if rec.kind == "own":
            if cur is None or rec.epoch == cur.epoch + 1 or (rec.epoch == cur.epoch and rec.by == cur.owner):
                self.owners[key] = Owner(rec.by, rec.epoch, rec.until)
                return True
            return False
        if cur is not None and rec.epoch == cur.epoch and rec.by == cur.owner:
            del self.owners[key]
            return True
        return False

    def _prune(self, at: float) -> None:
        if at - self._pruned_at < 1.0:
            return
        self._pruned_at = at
        horizon = at - PRUNE_AFTER
        for k in [k for k, o in self.owners.items() if o.until < horizon]:
            del self.owners[k]
        for g in [g for g, h in self.holds.items() if h.until < horizon]:
            del self.holds[g]


def _folded_hold(cur: Hold | None, rec: HoldRecord, owner: Owner | None) -> tuple[bool, Hold | None]:
    """Whether `rec` is accepted, and the hold after it (None: released)."""
    if rec.kind == "claim":
        if cur is None or rec.epoch == cur.epoch + 1:
            return True, Hold(rec.by, rec.epoch, False, rec.until, rec.partition)
    elif rec.kind == "take":
        seen = owner.epoch if owner is not None else -1
        fresh = cur is None or rec.epoch == cur.epoch + 1
        own_claim = cur is not None and rec.epoch == cur.epoch and cur.holder == rec.by and not cur.granted
        if seen == rec.over and (fresh or own_claim):
            return True, Hold(rec.by, rec.epoch, True, rec.until, rec.partition)
    elif rec.kind == "grant":
        if cur is None and rec.to:  # a reader that started after the claim: the grant stands
            return True, Hold(rec.to, rec.epoch, True, rec.until, rec.partition)
        if (
            cur is not None
            and rec.epoch == cur.epoch
            and rec.to == cur.holder
            and not cur.granted
            and owner is not None
            and owner.owner == rec.by
        ):
            return True, replace(cur, granted=True, until=max(cur.until, rec.until))
    elif rec.kind == "renew":
        if cur is None:
            return True, Hold(rec.by, rec.epoch, True, rec.until, rec.partition)
        if rec.epoch == cur.epoch and rec.by == cur.holder:
            return True, replace(cur, until=rec.until)
    elif rec.kind == "release":
        if cur is not None and rec.epoch == cur.epoch and rec.by == cur.holder:
            return True, None
    return False, cur
