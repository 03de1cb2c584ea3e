"""Receive hooks: how code outside a statement learns of RECEIVEs and rollbacks (the worker's queue
monitors do). Subclass ReceiveHooks (or write any class with its three methods), override what
you need, and append an instance to Broker.hooks. Hooks run on the thread of the statement; a
failing hook is logged, never raised into the statement."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

log = logging.getLogger("kbroker.client")


class ReceiveHooks(Protocol):
    """The hooks a Broker calls around RECEIVE. Every method does nothing by default (its body
    returns None rather than being empty, so a type checker does not take it for abstract)."""

    def before_receive(self, queue: str) -> None:
        """A RECEIVE on `queue` is about to wait for messages (called once per round it waits)."""
        return None  # noqa: RET501

    def after_receive(self, queue: str, count: int) -> None:
        """That RECEIVE round returned `count` messages (0: it waited for nothing)."""
        return None  # noqa: RET501

    def after_rollback(self, queue: str) -> None:
        """A transaction that received from `queue` rolled back."""
        return None  # noqa: RET501


class HookFanOut(ReceiveHooks):
    """Calls each of `hooks` in turn (a live view: hooks added later are called too), logging
    and swallowing a failure so the statement and the other hooks go on."""

    def __init__(self, hooks: Sequence[ReceiveHooks]):
        self._hooks = hooks

    def before_receive(self, queue: str) -> None:
        """Call every hook's before_receive."""
        for hook in self._hooks:
            try:
                hook.before_receive(queue)
            except Exception:
                log.exception("hook before_receive of %r failed", hook)

    def after_receive(self, queue: str, count: int) -> None:
        """Call every hook's after_receive."""
        for hook in self._hooks:
            try:
                hook.after_receive(queue, count)
            except Exception:
                log.exception("hook after_receive of %r failed", hook)

    def after_rollback(self, queue: str) -> None:
        """Call every hook's after_rollback."""
        for hook in self._hooks:
            try:
                hook.after_rollback(queue)
            except Exception:
                log.exception("hook after_rollback of %r failed", hook)
