"""Recoverability as NServiceBus has it: immediate retries, then delayed retries, then the error
queue. Pure: no I/O, the time is a parameter.

A message whose handler fails is handed out again at once (an immediate retry) up to
`immediate_retries` times in the instance that failed it (5; NServiceBus counts these in memory
too). Past that, the message is removed and a copy stored in the endpoint's delayed store, due
`time_increase` seconds later per round (10, 20, 30 s), its round in the `NServiceBus.Retries`
header, so whichever instance receives it next goes on counting (a delayed retry). After
`delayed_retries` rounds (3), or at once for an exception of an `unrecoverable` type, it goes to
the error queue (a transport queue, `error`) with NServiceBus's failure headers beside its own.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from kbroker.core.transport.endpoint import ERROR_QUEUE, QUEUE_RE

IMMEDIATE_RETRIES = 5
DELAYED_RETRIES = 3
TIME_INCREASE = 10.0  # seconds added to each delayed round's delay

# NServiceBus's headers of a failed message (its error queue's readers look for these).
FAILED_Q = "NServiceBus.FailedQ"
TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
EXCEPTION = "NServiceBus.ExceptionInfo."
EXCEPTION_TYPE = EXCEPTION + "ExceptionType"
INNER_EXCEPTION_TYPE = EXCEPTION + "InnerExceptionType"
EXCEPTION_MESSAGE = EXCEPTION + "Message"
EXCEPTION_SOURCE = EXCEPTION + "Source"
EXCEPTION_STACK_TRACE = EXCEPTION + "StackTrace"
HELP_LINK = EXCEPTION + "HelpLink"
PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
RETRIES = "NServiceBus.Retries"  # delayed rounds so far
RETRIES_TIMESTAMP = "NServiceBus.Retries.Timestamp"
MAX_STACK_TRACE = 16 * 1024  # characters of a stack trace kept in its header


class ErrorResult(enum.Enum):
    """What an endpoint's `on_error` callback decided for a message whose handler raised
    (NServiceBus's ErrorHandleResult); returning None leaves it to the recoverability policy."""

    HANDLED = "handled"  # removed, with the sends on_error made, in one transaction
    RETRY = "retry required"  # rolled back and handed out again at once, whatever the policy says


class Action(enum.Enum):
    """What becomes of a message that failed again."""

    IMMEDIATE = "immediate retry"  # handed out again, here
    DELAYED = "delayed retry"  # through the delayed store, `delay` seconds
    ERROR = "error queue"


@dataclass(frozen=True)
class Failure:
    """What a handler raised, as the error queue's headers say it."""

    type: str
    message: str
    source: str = ""
    stack_trace: str = ""
    inner_type: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        t = type(exc)
        stack = "".join(traceback.format_exception(t, exc, exc.__traceback__))[-MAX_STACK_TRACE:]
        inner = exc.__cause__ or exc.__context__
        return cls(
            f"{t.__module__}.{t.__qualname__}",
            str(exc),
            t.__module__,
            stack,
            "" if inner is None else f"{type(inner).__module__}.{type(inner).__qualname__}",
        )

    def reason(self) -> str:
        return f"{self.type}: {self.message}"


@dataclass(frozen=True)
class Recoverability:
    """An endpoint's recoverability policy (NServiceBus's defaults). `unrecoverable`: exception
    types (or their full names) that go to the error queue without any retry."""

    immediate_retries: int = IMMEDIATE_RETRIES
    delayed_retries: int = DELAYED_RETRIES
    time_increase: float = TIME_INCREASE
    error_queue: str = ERROR_QUEUE
    unrecoverable: tuple[type[BaseException] | str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("immediate_retries", "delayed_retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
                raise ValueError(f"{name} must be a whole number 0-1000, not {value!r}")
        if isinstance(self.time_increase, bool) or not 0 < self.time_increase <= 86_400:
            raise ValueError(f"time_increase must be seconds in (0, 86400], not {self.time_increase!r}")
        if not isinstance(self.error_queue, str) or not QUEUE_RE.fullmatch(self.error_queue):
            raise ValueError(f"error queue {self.error_queue!r} must be 1-150 characters of A-Z a-z 0-9 _ . -")
        object.__setattr__(self, "unrecoverable", tuple(self.unrecoverable))

    def is_unrecoverable(self, failure: Failure) -> bool:
        names = {u if isinstance(u, str) else f"{u.__module__}.{u.__qualname__}" for u in self.unrecoverable}
        short = failure.type.rsplit(".", 1)[-1]
        return failure.type in names or short in names

    def decide(self, failures: int, rounds: int, failure: Failure | None, *, delayed: bool = True) -> Action:
        """What to do with a message that failed `failures` times in a row here, after `rounds`
        delayed retries, last with `failure`. `delayed`: whether a delayed retry is possible (a
        satellite or an endpoint without a delayed store has none)."""
        if failure is not None and self.is_unrecoverable(failure):
            return Action.ERROR
        if failures <= self.immediate_retries:
            return Action.IMMEDIATE
        if delayed and rounds < self.delayed_retries:
            return Action.DELAYED
        return Action.ERROR

    def delay(self, rounds: int) -> float:
        """The delay of the delayed retry after `rounds` earlier ones: 10, 20, 30 s, ..."""
        return (rounds + 1) * self.time_increase


def rounds_of(headers: Mapping[str, str]) -> int:
    """The delayed rounds a message has had (its `NServiceBus.Retries`; anything else is 0)."""
    text = headers.get(RETRIES, "0").strip()
    return int(text) if text.isdigit() and len(text) < 6 else 0


def nsb_time(now: datetime) -> str:
    """A time as NServiceBus writes its headers: `2026-12-02 10:00:00:123456 Z` (UTC)."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S:%f Z")


def delayed_retry_headers(headers: Mapping[str, str], rounds: int, now: datetime) -> dict[str, str]:
    """The headers of a message's next delayed retry."""
    return {**headers, RETRIES: str(rounds + 1), RETRIES_TIMESTAMP: nsb_time(now)}


def failed_headers(
    headers: Mapping[str, str], queue: str, failure: Failure | None, *, endpoint: str, machine: str, now: datetime
) -> dict[str, str]:
    """The headers of a message's copy in the error queue: its own, and why and where it failed."""
    f = failure or Failure("Unknown", "the message failed; its failure is not known here")
    return {
        **headers,
        FAILED_Q: queue,
        TIME_OF_FAILURE: nsb_time(now),
        EXCEPTION_TYPE: f.type,
        INNER_EXCEPTION_TYPE: f.inner_type,
        HELP_LINK: "",
        EXCEPTION_MESSAGE: f.message,
        EXCEPTION_SOURCE: f.source,
        EXCEPTION_STACK_TRACE: f.stack_trace,
        PROCESSING_ENDPOINT: endpoint,
        PROCESSING_MACHINE: machine,
    }


def retried_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a failed message sent back to its queue: the failure's and the rounds'
    removed, so it starts its retries afresh."""
    return {
        k: v
        for k, v in headers.items()
        if not k.startswith(EXCEPTION) and k not in (FAILED_Q, TIME_OF_FAILURE, RETRIES, RETRIES_TIMESTAMP)
    }
