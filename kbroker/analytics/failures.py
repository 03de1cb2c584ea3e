"""How the analytics job meets failures: a batch step asked again when it fails transiently
(`again_on_failure`), and the text of a failed query read for what it says (`first_line`, and
`refusal_in`: the authorizer's refusal as a PermissionDeniedError, whether kbroker's own or Kafka's
Java client's through Spark's Kafka source)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kbroker.errors import PermissionDeniedError

__all__ = ["BATCH_STEP_ATTEMPTS", "again_on_failure", "first_line", "refusal_in"]

log = logging.getLogger("kbroker.analytics")  # the job's logger (run_forever limits its lines)

BATCH_STEP_ATTEMPTS = 3
T = TypeVar("T")


def again_on_failure(
    what: str,
    step: Callable[[], T],
    batch_id: int,
    stopping: threading.Event,
    retriable: tuple[type[BaseException], ...] = (Exception,),
) -> T:
    """step(), asked again (up to BATCH_STEP_ATTEMPTS times in all, a second more each time) when
    it fails with a `retriable` error. A failed step failed the batch, which stops the query:
    `kbroker analytics run` starts it again from its checkpoint, but seconds later, and a job that
    is not supervised so stayed stopped. Both steps asked again are the same the second time: the
    rows of the batch's own offsets, and its results in a transaction the failed one's producer
    could not commit (a new producer of the same id fenced it)."""
    for attempt in range(1, BATCH_STEP_ATTEMPTS + 1):
        try:
            return step()
        except retriable as exc:
            if attempt == BATCH_STEP_ATTEMPTS or stopping.is_set():
                raise
            log.warning("batch %d: %s failed (%s); trying again", batch_id, what, first_line(exc))
            stopping.wait(attempt)
    raise AssertionError("unreachable")


def first_line(error: object) -> str:
    """An error in one line: Spark's carry the query plan and the JVM's stack after it."""
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else repr(error))[:300]


# How the authorizer's refusal reads in a failed query's text: kbroker's own (raised in a batch,
# its one line), or Kafka's Java client's (Spark's Kafka source).
_KBROKER_REFUSAL = re.compile(r"(permission denied: [^\n]*)")
_JAVA_REFUSAL = re.compile(r"(Topic|Group|Cluster|TransactionalId)AuthorizationException: ([^\n]*)")
_JAVA_KINDS = {"Topic": "topic", "Group": "group", "Cluster": "cluster", "TransactionalId": "transactional id"}


def refusal_in(error: Any, principal: str = "") -> PermissionDeniedError | None:
    """The authorizer's refusal a failed query (or any error) carries, as a PermissionDeniedError;
    None when it is not one."""
    if error is None:
        return None
    if isinstance(error, PermissionDeniedError):
        return error.naming(principal)
    text = str(error)
    own = _KBROKER_REFUSAL.search(text)
    if own is not None:
        return PermissionDeniedError(own.group(1).strip())
    java = _JAVA_REFUSAL.search(text)
    if java is not None:
        kind = _JAVA_KINDS[java.group(1)]
        return PermissionDeniedError(
            resource=kind,
            operation="READ" if kind in ("topic", "group") else "",
            principal=principal,
            what=f"Spark's Kafka source: {java.group(2).strip()[:200]}",
        )
    return None
