"""What the dispatcher knows of each dialog direction besides its expected number (pure logic):
which namespace each conversation belongs to, and when a direction ended.

A conversation belongs to the namespace whose message for it this namespace took first; another
namespace's message that claims it is refused, even signed (core/routing/signing.py proves who
sent a record, not whose dialog it is). A direction ends when its EndDialog or Error is saved, or
it is refused; once `forget_after` has passed, its acknowledgement is tombstoned, so the acks
topic, and every read of it, holds the dialogs that ended lately, not every one there ever was.
`forget_after` is twice signing.MAX_AGE by default: no signature made before a direction ended
is good any more when it is forgotten, so a replayed copy cannot be taken as new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.routing.signing import MAX_AGE
from kbroker.core.routing.transmission import parse_ack_key, read_ack

FORGET_AFTER = 2 * MAX_AGE


def read_acks(raw: Mapping[bytes, bytes]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(the acknowledgements by direction key, why each record that is none was skipped)."""
    acks: dict[str, dict[str, Any]] = {}
    skipped = []
    for k, v in raw.items():
        key = k.decode(errors="replace")
        try:
            if parse_ack_key(key) is None:
                raise MalformedRecord("its key is no dialog direction")
            acks[key] = read_ack(v)
        except MalformedRecord as exc:
            skipped.append(f"{key!r}: {exc}")
    return acks, skipped


class Directions:
    def __init__(self, forget_after: float = FORGET_AFTER):
        self.forget_after = forget_after
        self.owners: dict[str, str] = {}  # conversation id -> the namespace it belongs to
        self.ended: dict[str, float] = {}  # direction key -> when it ended

    def load(self, acks: Mapping[str, Mapping[str, Any]]) -> None:
        self.owners, self.ended = {}, {}
        for key, ack in acks.items():
            parsed = parse_ack_key(key)
            if parsed is not None:
                self.owners.setdefault(parsed[1], parsed[0])
            at = ack.get("ended")
            if isinstance(at, (int, float)):
                self.ended[key] = float(at)

    def refusal(self, sender: str, conversation: str) -> str | None:
        """Why `sender` may not send on `conversation` (it is another namespace's), or None;
        the conversation is `sender`'s from now on when it was nobody's."""
        owner = self.owners.setdefault(conversation, sender)
        return None if owner == sender else f"conversation {conversation} belongs to namespace {owner!r}"

    def end(self, key: str, now: float) -> None:
        self.ended.setdefault(key, now)

    def due(self, now: float) -> list[str]:
        """The directions ended `forget_after` ago: their acknowledgements go."""
        return sorted(k for k, at in self.ended.items() if now - at >= self.forget_after)

    def forget(self, keys: list[str]) -> None:
        for key in keys:
            self.ended.pop(key, None)
        for key in keys:
            parsed = parse_ack_key(key)
            if parsed is not None and not any(k.split("|")[1] == parsed[1] for k in self.ended):
                self.owners.pop(parsed[1], None)

    def checkpoint(self) -> tuple[dict[str, str], dict[str, float]]:
        return dict(self.owners), dict(self.ended)

    def restore(self, saved: tuple[dict[str, str], dict[str, float]]) -> None:
        self.owners, self.ended = dict(saved[0]), dict(saved[1])
