"""Receive hooks: defaults do nothing, the fan-out calls every hook and survives a failing one."""

from __future__ import annotations

import logging

import pytest

from kbroker.sdk.hooks import HookFanOut, ReceiveHooks


class Recorder(ReceiveHooks):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def after_receive(self, queue: str, count: int) -> None:
        self.calls.append(("after_receive", queue, count))


class Failing(ReceiveHooks):
    def before_receive(self, queue: str) -> None:
        raise RuntimeError("monitor down")


def test_fan_out_calls_each_hook_and_logs_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    first, last = Recorder(), Recorder()
    hooks: list[ReceiveHooks] = [first, Failing()]
    fan_out = HookFanOut(hooks)
    hooks.append(last)  # a live view: hooks registered later are called too
    with caplog.at_level(logging.ERROR, logger="kbroker.client"):
        fan_out.before_receive("Q")  # Failing raises: logged, not raised
        fan_out.after_receive("Q", 3)
        fan_out.after_rollback("Q")  # the defaults do nothing
    assert first.calls == last.calls == [("after_receive", "Q", 3)]
    assert "before_receive" in caplog.text and "monitor down" in caplog.text
