"""Who committed a queue partition's offsets: the committing process's transactional ids, carried
in the offsets' commit metadata after the completed offsets (core/receive/offsets.py). Pure logic, no I/O.

Why: a reader killed inside a group commit leaves its Kafka transaction open, and the partitions
whose offsets it carries stay unreadable to their next owner until Kafka aborts it after
transaction.timeout.ms (plus the coordinator's check interval: 11 s on the embedded broker, up to
20 s on a cluster at Kafka's defaults). The next owner cannot see the open transaction's offsets,
but it can read the last committed ones (read_uncommitted), and their metadata names the process
that committed them, most often the one that died. Fencing that process's transactional ids
(kafka/receive/open_transaction_fence.py) aborts the open transaction at once.

The holder is the ids' UUIDs only: every committer's ids are `kbroker.<namespace>.<uuid>`, so the
ids are rebuilt under the reader's own namespace. A holder another client wrote can therefore name
nothing outside the namespace's transactional ids, and at most MAX_IDS of them.
"""

from __future__ import annotations

import uuid

MARK = "|by:"  # after the completed offsets' encoding (base64 and "kb1:" never contain "|")
MAX_IDS = 4
# The most a holder adds to the metadata: the mark and MAX_IDS UUIDs in hex with commas.
ROOM = len(MARK) + MAX_IDS * 33


def transactional_id(namespace: str, key: uuid.UUID | str) -> str:
    """A committer's transactional id in `namespace`."""
    return f"kbroker.{namespace}.{key}"


def holder_of(transactional_ids: tuple[str, ...], namespace: str) -> str:
    """The holder naming `transactional_ids` (those not of the form transactional_id() gives are
    left out: they could not be rebuilt)."""
    prefix = transactional_id(namespace, "")
    keys = []
    for tid in transactional_ids[:MAX_IDS]:
        try:
            keys.append(uuid.UUID(tid[len(prefix) :]).hex if tid.startswith(prefix) else None)
        except ValueError:
            continue
    return ",".join(k for k in keys if k)


def with_holder(metadata: str, holder: str) -> str:
    """`metadata` (the completed offsets) followed by the holder."""
    return f"{metadata}{MARK}{holder}" if holder else metadata


def split_holder(metadata: str | None) -> tuple[str, str]:
    """(the completed offsets' part, the holder or "") of commit metadata."""
    body, _, holder = (metadata or "").partition(MARK)
    return body, holder


def holder_ids(metadata: str | None, namespace: str) -> tuple[str, ...]:
    """The transactional ids the metadata's holder names, rebuilt under `namespace`; anything
    that is not a UUID is ignored (the metadata may be another client's)."""
    out = []
    for part in split_holder(metadata)[1].split(",")[:MAX_IDS]:
        try:
            out.append(transactional_id(namespace, uuid.UUID(hex=part)))
        except ValueError:
            continue
    return tuple(dict.fromkeys(out))
