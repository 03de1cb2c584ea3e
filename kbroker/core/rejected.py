"""Records a kbroker reader will not use: one way for every reader to set them aside (G8).

Any client that may write a topic kbroker reads may write anything onto it. Every reader of a
kbroker topic decodes each record with a decoder that returns the decoded value or raises
`Rejected` (a ValueError) naming what the record is not; never another exception (`decoding`
turns any other into a Rejected, and the property tests hold each decoder to it). The reader
then skips the record, hands it to kafka/rejects.py's `Rejects.reject(record, reason)`, and goes
on. What is kept of the record is `rejection_records`: its copy on the namespace's dead-letter
topic with kb.dlq.* headers (core/dead_letter.py's: the reason, topic, partition, offset, plus
kb.dlq.reader, which reader refused it), and a RECORD_REJECTED event on the events topic.

The API, for every reader (the routing topics' readers too):

    Rejected(reason)                   what a decoder raises for a record it will not use
    decoding(decoder, *args)           runs a decoder: its value, or Rejected for any exception
    json_object(raw) / text_key(key)   the common first steps: a JSON object, a UTF-8 key
    typed(cls, mapping)                a dataclass from a JSON object whose fields have its types
    Consumed(topic, partition, ...)    a record as a consumer gave it, for readers whose client
                                       is not confluent-kafka (Faust's events, Spark's rows)
    position(record)                   "topic[partition]@offset", for log lines
    rejection_records(ns, record, reason, reader, now_ms) -> [dead letter, event]

Who records a record every process reads (a compacted topic read whole: the catalog, the
endpoints, the readers' reports) is the reader's choice, so that one bad record is not a dead
letter per process per start, nor a warning per process per read: see kafka/rejects.py. Pure: no
I/O.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

import orjson

from kbroker.core import names
from kbroker.core.dead_letter import ConsumedRecord, _reason, dead_letter_record, set_aside
from kbroker.core.records import Header, Record
from kbroker.core.topic_limits import DEAD_LETTER_LIMIT, record_bytes

RECORD_REJECTED = "RECORD_REJECTED"  # the event of a record a reader set aside

T = TypeVar("T")


class Rejected(ValueError):
    """A record a reader will not use, and why (one line)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def decoding(decoder: Callable[..., T], *args: Any) -> T:
    """`decoder(*args)`, with any exception it raises (a KeyError of a missing field, a pydantic
    ValidationError, a UnicodeDecodeError) as a Rejected saying what it was."""
    try:
        return decoder(*args)
    except Rejected:
        raise
    except Exception as exc:  # noqa: BLE001 - any way a decoder fails is a reason to set aside
        raise Rejected(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")) from None


def json_object(raw: bytes | None) -> dict[str, Any]:
    """The value as a JSON object (a mapping), else Rejected."""
    if raw is None:
        raise Rejected("no value")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Rejected(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise Rejected(f"not a JSON object but {type(value).__name__}")
    return value


def text_key(key: bytes | str | None) -> str:
    """The key as text, else Rejected (no key, or not UTF-8)."""
    if key is None:
        raise Rejected("no key")
    if isinstance(key, str):
        return key
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise Rejected(f"key {key[:40]!r} is not UTF-8") from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type a dataclass field declares (the types kbroker's records
    use: str, int, float, bool, None, their unions, tuple[str, ...], Literal); others pass."""
    return _checker(hint)(value)


def _is_number(value: Any) -> bool:  # an int field written as 1.0 still counts
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checker(hint: Any) -> Callable[[Any], bool]:
    """_fits for one hint as a function, worked out once: typing's introspection per field of
    every record read cost more than the rest of decoding it."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        alternatives = tuple(_checker(h) for h in typing.get_args(hint))
        return lambda value: any(fits(value) for fits in alternatives)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return lambda value: value in allowed
    if origin is tuple:
        inner = typing.get_args(hint)
        if len(inner) != 2 or inner[1] is not Ellipsis:
            return lambda value: isinstance(value, (list, tuple))
        item = _checker(inner[0])
        return lambda value: isinstance(value, (list, tuple)) and all(item(v) for v in value)
    if hint is type(None) or hint is None:
        return lambda value: value is None
    if hint is bool:
        return lambda value: isinstance(value, bool)
    if hint in (int, float):
        return _is_number
    if hint is str:
        return lambda value: isinstance(value, str)
    return lambda value: True


# Per dataclass, worked out once: its fields' checkers, hints (for the reason) and fields.
_shapes: dict[type, tuple[dict[str, Callable[[Any], bool]], dict[str, Any], dict[str, Any]]] = {}


def _shape(cls: type) -> tuple[dict[str, Callable[[Any], bool]], dict[str, Any], dict[str, Any]]:
    """A dataclass's field checkers, types and fields, once per class: get_type_hints evaluates
    every annotation's text again on each call (about 0.4 ms for an Endpoint, paid per
    endpoint record every process reads)."""
    shape = _shapes.get(cls)
    if shape is None:
        hints = typing.get_type_hints(cls)
        shape = _shapes[cls] = (
            {name: _checker(hint) for name, hint in hints.items()},
            hints,
            {f.name: f for f in fields(cls)},
        )
    return shape


def typed(cls: type[T], d: dict[str, Any]) -> T:
    """`cls(**d)` for a dataclass, once every field of `d` has the field's type and every field
    without a default is there; else Rejected naming the field. List fields become tuples."""
    checks, hints, known = _shape(cls)
    for name in d:
        if name not in known:
            raise Rejected(f"unknown field {name!r}")
    for name, f in known.items():
        if name not in d:
            if f.default is MISSING and f.default_factory is MISSING:
                raise Rejected(f"field {name!r} is missing")
        elif not checks[name](d[name]):
            raise Rejected(f"field {name!r} is {type(d[name]).__name__}, not {hints[name]}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass(frozen=True)
class Consumed:
    """A consumed record with the accessors of confluent_kafka.Message (ConsumedRecord)."""

    topic_: str
    partition_: int | None
    offset_: int | None
    key_: bytes | None = None
    value_: bytes | None = None
    headers_: list[tuple[str, bytes]] | None = field(default=None)

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int | None:
        return self.partition_

    def offset(self) -> int | None:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.headers_


def position(record: ConsumedRecord) -> str:
    return f"{record.topic()}[{record.partition()}]@{record.offset()}"


def rejection_records(
    namespace: str, record: ConsumedRecord, reason: str, reader: str, now_ms: int, limit: int = DEAD_LETTER_LIMIT
) -> list[Record]:
    """The record's dead letter (with kb.dlq.reader besides dead_letter's headers) and the
    RECORD_REJECTED event (keyed by the topic, so one topic's events stay in order). A control
    topic's record is not bound by the queues' limits: one the dead-letter topic would refuse
    goes without its body (dead_letter.set_aside's letter, kb.dlq.size saying how big it was)."""
    topic, key, value, headers = dead_letter_record(namespace, record, reason)
    if record_bytes(key, value, headers) > limit:
        topic, key, value, headers = set_aside(namespace, record, reason, limit, now_ms=now_ms)[0]
    own: list[Header] = [("kb.dlq.reader", reader.encode())]
    event = {
        "event": RECORD_REJECTED,
        "topic": record.topic(),
        "partition": record.partition(),
        "offset": record.offset(),
        "reader": reader,
        "reason": _reason(reason).decode(errors="replace"),
        "time": now_ms,
    }
    return [
        (topic, key, value, (headers or []) + own),
        (names.events_topic(namespace), str(record.topic()).encode(), orjson.dumps(event), None),
    ]
