"""The guard around the worker's periodic work (the tick, the catalog refresh, the queue watcher,
the monitor and tick agents, the timer service): a failure is logged once per window, recorded as
a degraded reason and retried with back-off, and never reaches Faust, which would stop the worker
("We experienced a crash!") on an exception from a timer or an agent."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from kbroker.core.health import Health
from kbroker.core.log_limit import LogLimiter
from kbroker.errors import DENIED_CODES, PermissionDeniedError, is_refusal, kafka_error


def is_retriable(exc: BaseException) -> bool:
    """kbroker errors say so; Kafka clients' errors (aiokafka, librdkafka) count as transient,
    but for the authorizer's refusals."""
    if is_refusal(exc):
        return False
    retriable = getattr(exc, "retriable", None)
    if isinstance(retriable, bool):
        return retriable
    if callable(retriable):  # confluent_kafka.KafkaError.retriable()
        try:
            return bool(retriable())
        except Exception:  # noqa: BLE001 - an error that cannot say counts as permanent
            return False
    module = type(exc).__module__ or ""
    return module.startswith(("aiokafka", "kafka", "confluent_kafka")) or isinstance(
        exc, (TimeoutError, ConnectionError)
    )


def refusal_of(exc: BaseException, principal: str, operation: str = "READ") -> PermissionDeniedError:
    """The authorizer's refusal `exc` (is_refusal) as a PermissionDeniedError naming the
    principal: kbroker's own, or one of the worker's aiokafka clients' (whose error names the
    topic or group it was refused; `operation`: what that client was doing)."""
    if isinstance(exc, PermissionDeniedError):
        return exc.naming(principal)
    first = exc.args[0] if exc.args else None
    if callable(getattr(first, "code", None)):  # a confluent_kafka KafkaException
        refused = kafka_error("the worker", first, principal=principal)
        return refused if isinstance(refused, PermissionDeniedError) else PermissionDeniedError(str(exc))
    kind = DENIED_CODES.get(getattr(exc, "errno", None), "resource")  # type: ignore[arg-type]
    name = str(first) if isinstance(first, str) else ""
    return PermissionDeniedError(
        resource=f"{kind} {name}" if name else "",
        operation=operation,
        principal=principal,
        what="the worker's Faust client",
        kind=kind,
    )


class Guard:
    """Runs and records the worker's periodic work. `health` holds the degraded reasons that the
    monitor rows and /tasks/ show."""

    def __init__(
        self,
        log: logging.Logger,
        health: Health | None = None,
        limiter: LogLimiter | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.log = log
        self.health = health or Health()
        self.limiter = limiter or LogLimiter()
        self._clock = clock
        # Called, from any thread, with the authorizer's refusal: the worker stops on it (a
        # back-off would retry it for ever; it stands until an operator grants the ACL).
        self.on_refused: Callable[[BaseException], None] | None = None

    def due(self, component: str) -> bool:
        """Whether `component`'s back-off is over (or it is not failing)."""
        return self.health.due(component, self._clock())

    def failed(self, component: str, exc: BaseException, queue: str | None = None) -> None:
        """Record a failure (of `queue`'s work, or the whole worker's): a degraded reason, and a
        log line for the first failure (with the traceback unless the error is a transient one)
        and a count once per window after."""
        if is_refusal(exc) and self.on_refused is not None:
            self.on_refused(exc)
        retriable = is_retriable(exc)
        error = f"{type(exc).__name__}: {exc}"
        reason = self.health.failed(component, error, retriable, self._clock(), queue)
        held = self.limiter.admit(component, error)
        if held is None:
            return
        if held:
            self.log.warning(
                "%s still failing (%d failures since %s, %d not logged): %s",
                component,
                reason.failures,
                time.strftime("%H:%M:%S", time.localtime(reason.since)),
                held,
                error,
            )
        else:
            self.log.warning(
                "%s failed, will retry with back-off: %s", component, error, exc_info=None if retriable else exc
            )

    def succeeded(self, component: str) -> None:
        """Clear `component`'s reason; log its recovery once if it was failing."""
        reason = self.health.succeeded(component)
        self.limiter.recovered(component)
        if reason is not None:
            self.log.info(
                "%s recovered after %d failure(s) in %.1f s", component, reason.failures, self._clock() - reason.since
            )

    async def run(self, component: str, work: Callable[[], Awaitable[None]], backoff: bool = True) -> bool:
        """Run `work` unless `component` is backing off (with backoff=False, always: an agent's
        event must not be skipped); True if it ran and succeeded."""
        if backoff and not self.due(component):
            return False
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - nothing may reach Faust: it would stop the worker
            self.failed(component, exc)
            return False
        self.succeeded(component)
        return True
