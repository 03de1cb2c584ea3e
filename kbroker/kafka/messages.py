"""Typed access to a consumed Kafka record. confluent-kafka types every accessor of its Message as
optional, because one class serves both records and error events; a record that poll() returned
without an error always has its partition, offset and value. These helpers say so once, so the
modules that read records stay free of None checks that can never fire."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import KafkaError, Message

from kbroker.core.records import Header
from kbroker.errors import denied_code
from kbroker.kafka import clients


def records(
    batch: Iterable[Message],
    error: Callable[[KafkaError], object],
    *,
    transient: bool = True,
    refused: Callable[[KafkaError], Exception] | None = None,
) -> list[Message]:
    """The records of what a consumer returned; each error event in it but an end of partition
    goes to `error` (with transient=False, nor one librdkafka recovers from by itself). The
    authorizer's refusal (of the topic or the group) is raised instead, as `refused` makes it
    (a PermissionDeniedError by default): waiting does not make it go away."""
    out = []
    for msg in batch:
        err = msg.error()
        if err is None:
            out.append(msg)
        elif denied_code(err):
            raise (refused or _refusal)(err)
        elif err.code() != KafkaError._PARTITION_EOF and (transient or not clients.is_transient(err)):
            error(err)
    return out


def _refusal(err: KafkaError) -> Exception:
    return clients.kafka_error("consuming failed", err)


def position(msg: Message) -> tuple[int, int]:
    """(partition, offset) of a consumed record."""
    partition, offset = msg.partition(), msg.offset()
    if partition is None or offset is None:
        raise ValueError("an error event has no position")
    return partition, offset


def partition(msg: Message) -> int:
    """The partition of a consumed record."""
    return position(msg)[0]


def offset(msg: Message) -> int:
    """The offset of a consumed record."""
    return position(msg)[1]


def value(msg: Message) -> bytes:
    """The value of a consumed record; a tombstone's is empty."""
    return msg.value() or b""


def key(msg: Message) -> bytes:
    """The key of a consumed record; empty when it has none."""
    return msg.key() or b""


def headers(msg: Message) -> list[Header]:
    """A consumed record's headers as (name, bytes) pairs; a header without a value is empty."""
    return [(name, data.encode() if isinstance(data, str) else (data or b"")) for name, data in raw_headers(msg)]


def raw_headers(msg: Message) -> Iterable[tuple[str, bytes | str | None]]:
    """A consumed record's headers as they come, values not copied: for a decoder that reads
    each value once (envelope.header_text), on the receive path."""
    found = msg.headers() or ()
    return found.items() if isinstance(found, dict) else found


def error_code(msg: Message) -> int | None:
    """The error code of an error event, None for a record."""
    err = msg.error()
    return None if err is None else err.code()


def wire_headers(found: Sequence[Header] | None) -> list[tuple[str, str | bytes | None]] | None:
    """kbroker's (name, bytes) headers as Producer.produce takes them (its list type is wider)."""
    return None if found is None else list(found)
