"""Sending failed messages back from the error queue (`kbroker endpoint retry`), as the tools
that retry NServiceBus's failed messages do: each one chosen goes back to the queue it failed in
(its `NServiceBus.FailedQ`), its failure headers removed, in the transaction that removes it from
the error queue, so exactly once whoever else retries at the same time. One not chosen is
written to the error queue's end in the same way, so it stays, unchanged but for its place."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from kbroker.core.cluster import ClusterLike
from kbroker.core.transport.endpoint import ERROR_QUEUE, QUEUE_RE
from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import FAILED_Q, PROCESSING_ENDPOINT, retried_headers
from kbroker.kafka.transport.error_queue import waiting
from kbroker.sdk.transport.endpoint import TransportEndpoint


@dataclass
class Retried:
    """What a retry did: the Ids sent back, how many kept, and the Ids chosen but kept because
    their FailedQ is missing or names no installed queue."""

    sent_back: list[str] = field(default_factory=list)
    kept: int = 0
    unretriable: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"sent_back": self.sent_back, "kept": self.kept, "unretriable": self.unretriable}


def chooser(
    ids: Collection[str] = (), endpoint: str | None = None, every: bool = False
) -> Callable[[TransportMessage], bool]:
    """Which failed messages to send back: those of `ids`, or failed in `endpoint`, or all."""
    wanted = set(ids)

    def chosen(msg: TransportMessage) -> bool:
        if every:
            return True
        if endpoint is not None and msg.headers.get(PROCESSING_ENDPOINT) == endpoint:
            return True
        return msg.id in wanted

    return chosen


def retry_failed(
    cluster: ClusterLike,
    namespace: str,
    chosen: Callable[[TransportMessage], bool],
    *,
    queue: str = ERROR_QUEUE,
    wait: float = 5.0,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Retried:
    """Go once through what waits in the error queue `queue` now: send back the messages
    `chosen` accepts, keep the others (see the module docstring). `progress(done, total)`."""
    _found, total = waiting(cluster, namespace, queue, limit=0)
    out = Retried()
    seen: set[str] = set()  # Ids looked at in this pass (at most the queue's count)
    with TransportEndpoint(
        "kbroker-retry", cluster=cluster, namespace=namespace, send_only=True, recoverability=None
    ) as ep:
        for done in range(total):
            with ep.transaction() as tx:
                msg = tx.receive(wait, queue=queue)
                if msg is None:
                    break
                if msg.id in seen:  # a copy this pass kept, come round again: it stays, counted once
                    tx.put_records([ep.runtime.copy(msg, queue, msg.headers)[0]])
                    continue
                seen.add(msg.id)
                back = msg.headers.get(FAILED_Q, "")
                if chosen(msg) and QUEUE_RE.fullmatch(back) and ep.runtime.queues.exists(back):
                    tx.put_records([ep.runtime.copy(msg, back, retried_headers(msg.headers))[0]])
                    out.sent_back.append(msg.id)
                else:
                    if chosen(msg):
                        out.unretriable.append(msg.id)
                    tx.put_records([ep.runtime.copy(msg, queue, msg.headers)[0]])
                    out.kept += 1
            progress(done + 1, total)
    return out
