"""The transport contract, its on-error and concurrency behaviours (NServiceBus.TransportTests),
each against the real broker on both endpoints: requesting an immediate retry, sending from
on_error, the failure count kept between on_error calls, headers changed before on_error,
before a retry and in on_error (none survives), on_error throwing (the message comes back, the
critical error is raised), headers cleared by the sender after the send, the concurrency
raised and lowered while the pump runs, and a stop while on_error is in flight."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import ErrorResult, Recoverability
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.on_error import ErrorContext
from tests.helpers import wait_for
from tests.helpers.transport_faces import Face, Send, make_faces, received

NO_RETRIES = Recoverability(immediate_retries=0, delayed_retries=0)  # the policy alone: the error queue at once


@pytest.fixture(params=["threads", "asyncio"])
def faces(request: pytest.FixtureRequest, kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., Face]]:
    make, close = make_faces(request.param, kafka_bootstrap, namespace)
    yield make
    close()


def test_requesting_an_immediate_retry(faces: Callable[..., Face]) -> None:
    attempts: list[str] = []
    calls: list[int] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        attempts.append(msg.id)
        if len(attempts) == 1:
            raise RuntimeError("first attempt")

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        calls.append(ctx.immediate_failures)
        return ErrorResult.RETRY  # the policy would have sent it to the error queue

    ep = faces("Input", recoverability=NO_RETRIES, on_error=on_error).start(logic)
    mid = ep.send("Input", b"x")
    wait_for(lambda: len(attempts) == 2, 20, "the retry on_error asked for")
    time.sleep(0.5)
    assert attempts == [mid, mid] and calls == [1]
    assert received(faces("Reader"), 1, 2.0, queue="error") == []


def test_sending_from_on_error(faces: Callable[..., Face]) -> None:
    handled: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        if "FromOnError" not in msg.headers:
            send("Output", b"from the failing handler")  # dropped: the handler failed
            raise RuntimeError("Simulated exception")
        handled.append(msg.headers["FromOnError"])

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        send("Input", b"again", {"FromOnError": ctx.message.id})
        return ErrorResult.HANDLED

    out = faces("Output")
    ep = faces("Input", on_error=on_error).start(logic)
    mid = ep.send("Input", b"x")
    wait_for(lambda: handled, 20, "the message on_error sent")
    time.sleep(0.5)
    assert handled == [mid]  # the failed message was removed with the send: not handled again
    assert received(out, 1, 1.0) == []
    assert ep.sync.stats()["counters"]["handled_on_error"] == 1


def test_the_failure_count_is_kept_between_on_error_calls(faces: Callable[..., Face]) -> None:
    counts: list[tuple[int, str]] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        raise RuntimeError("always")

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        counts.append((ctx.immediate_failures, str(ctx.exception)))
        return ErrorResult.HANDLED if ctx.immediate_failures >= 3 else ErrorResult.RETRY

    faces("Input", recoverability=NO_RETRIES, on_error=on_error).start(logic).send("Input", b"x")
    wait_for(lambda: len(counts) == 3, 20, "three on_error calls", seen=lambda: counts)
    time.sleep(0.5)
    assert counts == [(1, "always"), (2, "always"), (3, "always")]


def test_headers_changed_by_the_handler_are_not_seen_by_on_error_or_the_retry(faces: Callable[..., Face]) -> None:
    in_on_error: list[str] = []
    on_retry: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        if in_on_error:
            on_retry.append(msg.headers["test-header"])
            return
        msg.headers["test-header"] = "modified"  # type: ignore[index]
        raise RuntimeError("after changing a header")

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        in_on_error.append(ctx.message.headers["test-header"])
        ctx.message.headers["test-header"] = "changed in on_error"  # type: ignore[index]
        return ErrorResult.RETRY

    ep = faces("Input", on_error=on_error).start(logic)
    ep.send("Input", b"x", {"test-header": "original"})
    wait_for(lambda: on_retry, 20, "the retry")
    assert in_on_error == ["original"] and on_retry == ["original"]


def test_on_error_that_throws_brings_the_message_back_and_raises_the_critical_error(
    faces: Callable[..., Face],
) -> None:
    critical: list[BaseException] = []
    seen: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        raise RuntimeError("Simulated exception")

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        seen.append(str(ctx.exception))
        if len(seen) == 1:
            raise ValueError("Exception from on_error")
        return ErrorResult.HANDLED

    faces("Input", on_error=on_error, on_critical_error=critical.append).start(logic).send("Input", b"x")
    wait_for(lambda: len(seen) == 2, 20, "on_error called again")
    time.sleep(0.5)
    assert seen == ["Simulated exception", "Simulated exception"]
    assert [str(c) for c in critical] == ["Exception from on_error"]


def test_on_error_returning_none_leaves_the_message_to_the_policy(faces: Callable[..., Face]) -> None:
    calls: list[int] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        raise RuntimeError("never works")

    def on_error(ctx: ErrorContext, send: Send) -> None:
        calls.append(ctx.immediate_failures)
        send("Output", b"dropped: only HANDLED sends")

    out = faces("Output")
    ep = faces("Input", recoverability=Recoverability(immediate_retries=1, delayed_retries=0), on_error=on_error)
    mid = ep.start(logic).send("Input", b"x")
    assert [m.id for m in received(faces("Reader"), 1, 20, queue="error")] == [mid]
    assert calls == [1, 2] and received(out, 1, 1.0) == []


def test_headers_cleared_by_the_sender_after_the_send(faces: Callable[..., Face]) -> None:
    seen: list[TransportMessage] = []
    ep = faces("Input").start(lambda msg, send: seen.append(msg))
    headers = {"HeaderPooling.Key1": "value1", "HeaderPooling.Key2": "value2"}
    ep.send("Input", b"sent", headers)
    headers.clear()
    in_tx = {"HeaderPooling.Key1": "in a transaction"}
    with ep.sync.transaction() as tx:
        tx.send("Input", b"in a transaction", in_tx)
        in_tx.clear()  # before the commit
    wait_for(lambda: len(seen) == 2, 20, "both messages")
    by_body = {m.body: m.headers for m in seen}
    assert by_body[b"sent"]["HeaderPooling.Key2"] == "value2"
    assert by_body[b"in a transaction"]["HeaderPooling.Key1"] == "in a transaction"


class Gate:
    """Handlers that block until opened, counting how many are in at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.done = 0

    def _enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def _leave(self) -> None:
        with self._lock:
            self.inside -= 1
            self.done += 1

    def handler(self, msg: TransportMessage, tx: Any) -> None:
        self._enter()
        self.open.wait(30)
        self._leave()

    async def ahandler(self, msg: TransportMessage, tx: Any) -> None:
        self._enter()
        await asyncio.to_thread(self.open.wait, 30)
        self._leave()


@pytest.mark.parametrize("model", ["monitor", "fixed"])
def test_concurrency_raised_then_lowered_while_running_the_last_holds(faces: Callable[..., Face], model: str) -> None:
    gate = Gate()
    ep = faces("Input", concurrency=model, max_concurrency=5).start_raw(gate.handler, gate.ahandler)
    receiver = ep.sync.runtime.receiver("Input")
    wait_for(lambda: receiver.stats()["partitions"], 30, "the queue's partitions")
    ep.change_concurrency(10)
    ep.change_concurrency(1)
    time.sleep(1.5)  # fixed: the readers retired by the change finish the receive they were in (1 s)
    for i in range(10):
        ep.send("Input", str(i).encode())
    wait_for(lambda: gate.inside, 20, "the first message in its handler")
    time.sleep(1.5)
    most = gate.most
    gate.open.set()
    wait_for(lambda: gate.done == 10, 30, "every message", seen=lambda: gate.done)
    assert most == 1


@pytest.mark.parametrize("model", ["monitor", "fixed"])
def test_concurrency_raised_while_running(faces: Callable[..., Face], model: str) -> None:
    gate = Gate()
    ep = faces("Input", concurrency=model, max_concurrency=1).start_raw(gate.handler, gate.ahandler)
    for i in range(8):
        ep.send("Input", str(i).encode())
    wait_for(lambda: gate.inside == 1, 20, "one message in its handler")
    ep.change_concurrency(4)
    wait_for(lambda: gate.inside == 4, 20, "four at once", seen=lambda: gate.inside)
    time.sleep(1.0)
    assert gate.most == 4
    gate.open.set()
    wait_for(lambda: gate.done == 8, 30, "every message", seen=lambda: gate.done)
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        ep.change_concurrency(0)


def test_stop_while_on_error_is_in_flight_finishes_it(faces: Callable[..., Face]) -> None:
    entered = threading.Event()
    attempts: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        attempts.append(msg.id)
        raise RuntimeError("to on_error")

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        entered.set()
        time.sleep(1.0)
        send("Output", b"from on_error")
        return ErrorResult.HANDLED

    out = faces("Output")
    ep = faces("Input", concurrency="fixed", max_concurrency=1, on_error=on_error).start(logic)
    ep.send("Input", b"x")
    assert entered.wait(20)
    ep.stop()  # waits for on_error and its commit
    assert [m.body for m in received(out, 1, 10)] == [b"from on_error"]
    ep.start(logic)
    time.sleep(2.0)
    assert len(attempts) == 1  # handled by on_error: not handed out again after the restart
