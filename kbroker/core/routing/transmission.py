"""The transmission queue as the transmitter holds it (pure logic): messages read from the
namespace's transmission topic and not yet acknowledged by the far side, when each is due to be
sent (again), why each waits, and how far the transmission topic may be committed.

Service Broker keeps an outgoing message in sys.transmission_queue until the far broker
acknowledges it, and sends it again after 4, 8, 16 and 32 s, then every 64 s (docs/sources.md, item 54).
Here the message stays a record of the transmission topic; the transmitter's consumer group commits
each partition only up to its oldest unacknowledged record, so a transmitter that dies leaves the
rest to whoever reads the partition next, which sends them again (the far dispatcher drops what it
already saved).

An acknowledgement is the far dispatcher's "next sequence number I expect" for one dialog
direction, keyed `<from namespace>|<conversation id>|<receiving side>`: every waiting message of
that direction below it is done. One that carries an error ends the direction: the far side refused
the dialog (an invalid message type or contract), and the sender's side gets an Error message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from kbroker.core.dialogs.envelope import MalformedRecord

RETRY_DELAYS = (4.0, 8.0, 16.0, 32.0)  # docs/sources.md, item 54: after 4, 8, 16 and 32 s ...
RETRY_EVERY = 64.0  # ... then once every 64 s
# A message sent this long ago and still not acknowledged holds its dialog up: the transmitter says
# so once (an event, a warning naming the conversation) and the view keeps a status. The 5th send
# is due 60 s after the first.
STALL_AFTER = 60.0


def retry_delay(attempts: int) -> float:
    """How long after its `attempts`-th send (1 = the first) a message is sent again."""
    if attempts < 1:
        return 0.0
    return RETRY_DELAYS[attempts - 1] if attempts <= len(RETRY_DELAYS) else RETRY_EVERY


def ack_key(from_broker: str, conversation_id: str, to_side: str) -> str:
    """The acks topic's key of one dialog direction."""
    return f"{from_broker}|{conversation_id}|{to_side}"


def parse_ack_key(key: str) -> tuple[str, str, str] | None:
    parts = key.split("|")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def read_ack(value: bytes | None) -> dict[str, Any]:
    """An acknowledgement's value, checked: {"next": n >= 0} with an optional "status" text and
    "error" {"code": int, "description": text}, and whatever else its writer added (when it
    was written). MalformedRecord says what is wrong with any other bytes."""
    try:
        ack = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        raise MalformedRecord("an acknowledgement that is not JSON") from None
    if not isinstance(ack, dict):
        raise MalformedRecord("an acknowledgement that is not a JSON object")
    nxt, error, status = ack.get("next"), ack.get("error"), ack.get("status")
    if type(nxt) is not int or nxt < 0:
        raise MalformedRecord(f"an acknowledgement's next sequence number is {nxt!r}")
    if status is not None and not isinstance(status, str):
        raise MalformedRecord("an acknowledgement's status is not text")
    if error is not None and not (
        isinstance(error, dict) and type(error.get("code")) is int and isinstance(error.get("description", ""), str)
    ):
        raise MalformedRecord("an acknowledgement's error is not {code, description}")
    return ack


@dataclass
class Outgoing:
    """One message of the transmission topic that the far side has not acknowledged."""

    partition: int
    offset: int
    conversation_id: str
    to_side: str
    sequence: int
    to_service: str
    to_broker: str | None
    from_service: str
    message_type: str
    contract: str
    handle: str  # the sending side's conversation handle (the record's key)
    enqueued: float  # the record's timestamp, seconds
    size: int
    record: Any = field(default=None, repr=False, compare=False)  # (value, headers): what the adapter sends
    attempts: int = 0
    next_try: float = 0.0
    status: str = ""  # sys.transmission_queue.transmission_status: blank until a send was tried
    destination: str | None = None
    first_sent: float | None = None
    lasting_status: str = ""  # why it waits that a resend does not change (the far side said, or it stalled)
    stall_noted: bool = False
    priority: int = 5  # the sending endpoint's (kb.priority): HONOR_BROKER_PRIORITY sends higher first
    security: str = ""  # its dialog security once sent: none, anonymous or full

    def row(self) -> dict[str, Any]:
        """The sys.transmission_queue row of this message."""
        return {
            "conversation_handle": self.handle,
            "conversation_id": self.conversation_id,
            "to_service_name": self.to_service,
            "to_broker_instance": self.to_broker,
            "from_service_name": self.from_service,
            "service_contract_name": self.contract,
            "enqueue_time": self.enqueued,
            "message_sequence_number": self.sequence,
            "message_type_name": self.message_type,
            "is_end_of_dialog": self.message_type.endswith("/EndDialog"),
            "is_conversation_error": self.message_type.endswith("/Error"),
            "priority": self.priority,
            "security": self.security,
            "transmission_status": self.status,
            "destination": self.destination,
            "attempts": self.attempts,
            "partition": self.partition,
            "offset": self.offset,
        }


@dataclass(frozen=True)
class Refusal:
    """An acknowledgement that ended a dialog direction with an error: the messages it dropped
    (the first one tells the sender's side whom to give the Error), the code and the text."""

    dropped: tuple[Outgoing, ...]
    code: int
    description: str


def by_priority(due: list[Outgoing]) -> list[Outgoing]:
    """`due` (in offset order) with the dialogs of higher priority first, each dialog's messages
    still in their order, whatever priority each SEND gave: a dialog ranks by its highest, then by
    its first message's place."""
    rank: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(due):
        top, first = rank.get(m.handle, (0, i))
        rank[m.handle] = (max(top, m.priority), first)
    order = {h: i for i, h in enumerate(sorted(rank, key=lambda h: (-rank[h][0], rank[h][1])))}
    return sorted(due, key=lambda m: order[m.handle])  # stable: a dialog's own order stays


class TransmissionQueue:
    """What one transmitter holds: per partition, the unacknowledged messages in offset order."""

    def __init__(self, from_broker: str):
        self.from_broker = from_broker
        self._by_partition: dict[int, dict[int, Outgoing]] = {}  # partition -> offset -> message
        self._read_to: dict[int, int] = {}  # partition -> next offset to read
        self._by_direction: dict[str, dict[int, Outgoing]] = {}  # ack key -> sequence -> message
        self._acked: dict[str, int] = {}  # ack key -> next sequence the far side expects
        self._refused: dict[str, tuple[int, str]] = {}  # ack key -> (code, text): drop what comes
        self.bytes = 0

    def __len__(self) -> int:
        return sum(len(p) for p in self._by_partition.values())

    def key_of(self, m: Outgoing) -> str:
        return ack_key(self.from_broker, m.conversation_id, m.to_side)

    # --- reading and acknowledging ------------------------------------------------------------

    def add(self, m: Outgoing) -> Refusal | None:
        """A message read from the transmission topic. Already acknowledged (read again after a
        rebalance): only moves the read position. For a refused direction: dropped at once."""
        self._read_to[m.partition] = max(self._read_to.get(m.partition, 0), m.offset + 1)
        key = self.key_of(m)
        if key in self._refused:
            code, text = self._refused[key]
            return Refusal((m,), code, text)
        if m.sequence < self._acked.get(key, 0):
            return None
        if m.offset in self._by_partition.get(m.partition, {}) or m.sequence in self._by_direction.get(key, {}):
            return None  # read again while held (a consumer's redelivery): counted once
        self._by_partition.setdefault(m.partition, {})[m.offset] = m
        self._by_direction.setdefault(key, {})[m.sequence] = m
        self.bytes += m.size
        return None

    def skip(self, partition: int, offset: int) -> None:
        """A record of the transmission topic that is no message (kept elsewhere): read past it."""
        self._read_to[partition] = max(self._read_to.get(partition, 0), offset + 1)

    def acknowledge(self, key: str, next_sequence: int, error: tuple[int, str] | None = None) -> Refusal | None:
        """The far side expects `next_sequence` next on direction `key`: drop what is below it.
        With `error`: the direction ended with that (code, text); everything of it is dropped."""
        if next_sequence > self._acked.get(key, 0):
            self._acked[key] = next_sequence
        waiting = self._by_direction.get(key, {})
        if error is not None:
            self._refused[key] = error
            dropped = tuple(waiting[s] for s in sorted(waiting))
            for m in dropped:
                self._remove(key, m)
            return Refusal(dropped, *error)
        for seq in [s for s in waiting if s < next_sequence]:
            self._remove(key, waiting[seq])
        return None

    def _remove(self, key: str, m: Outgoing) -> None:
        self._by_partition.get(m.partition, {}).pop(m.offset, None)
        direction = self._by_direction.get(key)
        if direction is not None:
            direction.pop(m.sequence, None)
            if not direction:
                del self._by_direction[key]
        self.bytes -= m.size

    def follows(self, m: Outgoing) -> int:
        """The sequence number of the message before `m` on its direction that the far side may
        not have saved yet: the highest one held below it, or -1 when none is held. -1 is true
        because this queue reads a partition in order from a position at or below its oldest
        unacknowledged message (commit_offsets), and a direction's messages all sit in one
        partition in sequence order (the send lease fences a dead holder's open transactions):
        every earlier message not held here was acknowledged. So the far dispatcher may save `m`
        after a gap in the numbers (a lease claimed after its holder died starts at the dead
        holder's ceiling) once it has saved what `m` follows."""
        below = [s for s in self._by_direction.get(self.key_of(m), {}) if s < m.sequence]
        return max(below, default=-1)

    def directions(self) -> set[str]:
        return set(self._by_direction)

    def forget(self, keys: Iterable[str] | None = None) -> None:
        """Forget acknowledgements no message here waits for any more (bounded memory); all such
        when `keys` is None. A message of a forgotten direction read later is sent again, and the
        far dispatcher acknowledges its copy again."""
        for key in list(self._acked) if keys is None else keys:
            if key not in self._by_direction:
                self._acked.pop(key, None)

    # --- sending ---------------------------------------------------------------------------

    def held(self) -> list[Outgoing]:
        """Every message held, in (partition, offset) order."""
        return [m for p in sorted(self._by_partition) for _, m in sorted(self._by_partition[p].items())]

    def due(self, now: float, honor_priority: bool = False) -> list[Outgoing]:
        """Messages to send now, in offset order (so each dialog's in sequence order); with
        `honor_priority` (HONOR_BROKER_PRIORITY), dialogs of higher priority first (priorities.py)."""
        due = [m for m in self.held() if m.next_try <= now]
        return by_priority(due) if honor_priority else due

    def wake(self, now: float, which: Callable[[Outgoing], bool]) -> int:
        """Make the held messages `which` accepts due now (a route changed, a connection opened);
        how many."""
        woken = [m for p in self._by_partition.values() for m in p.values() if which(m)]
        for m in woken:
            m.next_try = now
        return len(woken)

    def sent(self, m: Outgoing, now: float, destination: str) -> None:
        m.attempts += 1
        m.next_try = now + retry_delay(m.attempts)
        m.destination = destination
        m.status = m.lasting_status
        if m.first_sent is None:
            m.first_sent = now

    def waiting(self, m: Outgoing, now: float, status: str, retry_in: float, destination: str | None = None) -> None:
        """`m` could not be sent now (no route, no connection, ...): why, when to try again, and
        the destination it waits for, if it has one."""
        m.status = status
        m.next_try = now + retry_in
        if destination is not None:
            m.destination = destination

    def note_status(self, key: str, status: str) -> None:
        """A status the far side gave for a direction (the target service does not exist yet, a
        message it waits for): shown until the direction moves on, whatever resends happen."""
        for m in self._by_direction.get(key, {}).values():
            m.status = m.lasting_status = status

    def stalled(self, now: float, after: float = STALL_AFTER) -> list[Outgoing]:
        """Per direction, its first held message when it was first sent `after` seconds ago or
        more and is still not acknowledged, each once: the dialog makes no progress. One with no
        status yet gets one that says so."""
        out = []
        for direction in self._by_direction.values():
            m = direction[min(direction)]
            if m.stall_noted or m.first_sent is None or now - m.first_sent < after:
                continue
            m.stall_noted = True
            if not m.lasting_status:
                m.status = m.lasting_status = (
                    f"No acknowledgement from {m.destination} after {m.attempts} send(s) in {now - m.first_sent:.0f} s."
                )
            out.append(m)
        return out

    # --- the topic's head ------------------------------------------------------------------

    def commit_offsets(self) -> dict[int, int]:
        """Per partition read, the offset to commit: the oldest unacknowledged message's, or all
        that was read."""
        out = {}
        for p, read_to in self._read_to.items():
            waiting = self._by_partition.get(p)
            out[p] = min(waiting) if waiting else read_to
        return out

    def read_positions(self) -> dict[int, int]:
        """Per partition, the next offset this transmitter reads."""
        return dict(self._read_to)

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """Partitions another transmitter reads now: it sends what they hold."""
        for p in partitions:
            for m in list(self._by_partition.get(p, {}).values()):
                self._remove(self.key_of(m), m)
            self._by_partition.pop(p, None)
            self._read_to.pop(p, None)

    def backlog(self, now: float) -> dict[str, tuple[int, float]]:
        """Per destination (the next hop's address; "" while a message has none: no route, or
        not tried yet), the messages held and the age in seconds of the oldest."""
        out: dict[str, tuple[int, float]] = {}
        for p in self._by_partition.values():
            for m in p.values():
                count, age = out.get(m.destination or "", (0, 0.0))
                out[m.destination or ""] = (count + 1, max(age, now - m.enqueued))
        return out

    def rows(self, limit: int = 1000) -> list[dict[str, Any]]:
        return [m.row() for m in self.held()[:limit]]
