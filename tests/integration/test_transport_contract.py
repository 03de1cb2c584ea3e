"""The transport contract: behaviours of NServiceBus's own transport test suite
(NServiceBus.TransportTests), each against the real broker, run against both endpoints, the
thread one (sdk/transport/endpoint.py) and the asyncio one (sdk/transport/aio.py): a message
available, several available, the handler throwing and its message retried, failing after an
immediate and after a delayed retry, a failure after a send, stopping and starting again,
stopping with a message in flight, Unicode in headers, a send-only endpoint, and the transaction
modes ReceiveOnly and None (the on-error behaviours: test_transport_contract_errors.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import EXCEPTION_MESSAGE, FAILED_Q, RETRIES, ErrorResult, Recoverability
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.on_error import ErrorContext
from tests.helpers import wait_for
from tests.helpers.transport_faces import Face, Send, make_faces, received


@pytest.fixture(params=["threads", "asyncio"])
def faces(request: pytest.FixtureRequest, kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., Face]]:
    make, close = make_faces(request.param, kafka_bootstrap, namespace)
    yield make
    close()


def test_a_message_available(faces: Callable[..., Face]) -> None:
    seen: list[TransportMessage] = []
    ep = faces("Input").start(lambda msg, send: seen.append(msg))
    mid = ep.send("Input", b"\x00\x01 body", {"k": "v"}, correlation_id="c-1")
    wait_for(lambda: seen, 20, "the message")
    m = seen[0]
    assert (m.id, m.body, m.headers["k"], m.correlation_id) == (mid, b"\x00\x01 body", "v", "c-1")


def test_multiple_messages_available(faces: Callable[..., Face]) -> None:
    seen: list[str] = []
    ep = faces("Input").start(lambda msg, send: seen.append(msg.id))
    ids = {ep.send("Input", str(i).encode()) for i in range(25)}
    wait_for(lambda: len(seen) >= 25, 30, "25 messages", seen=lambda: len(seen))
    time.sleep(0.5)
    assert sorted(seen) == sorted(ids)


def test_on_message_throws_and_the_message_is_retried(faces: Callable[..., Face]) -> None:
    attempts: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        attempts.append(msg.id)
        if len(attempts) == 1:
            raise RuntimeError("first attempt")

    ep = faces("Input").start(logic)
    mid = ep.send("Input", b"x")
    wait_for(lambda: len(attempts) == 2, 20, "an immediate retry")
    time.sleep(0.5)
    assert attempts == [mid, mid]


def test_failing_after_immediate_and_delayed_retries_goes_to_the_error_queue(faces: Callable[..., Face]) -> None:
    rounds: list[str] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        rounds.append(msg.headers.get(RETRIES, "0"))
        raise RuntimeError("never works")

    ep = faces("Input").start(logic)
    mid = ep.send("Input", b"x")
    got = received(faces("Reader"), 1, 30, queue="error")
    assert [m.id for m in got] == [mid]
    assert rounds == ["0"] * 3 + ["1"] * 3  # 1 + 2 immediate retries, in each of 2 rounds
    assert got[0].headers[FAILED_Q] == "Input" and got[0].headers[EXCEPTION_MESSAGE] == "never works"


def test_a_failure_after_a_send_sends_nothing(faces: Callable[..., Face]) -> None:
    def logic(msg: TransportMessage, send: Send) -> None:
        send("Output", b"from a failing handler")
        raise RuntimeError("after the send")

    out = faces("Output")
    faces("Input", recoverability=Recoverability(immediate_retries=0, delayed_retries=0)).start(logic).send(
        "Input", b"x"
    )
    assert len(received(faces("Reader"), 1, 20, queue="error")) == 1
    assert received(out, 1, 2.0) == []


def test_stop_and_start_again(faces: Callable[..., Face]) -> None:
    seen: list[bytes | None] = []
    ep = faces("Input")
    ep.start(lambda msg, send: seen.append(msg.body))
    ep.send("Input", b"before")
    wait_for(lambda: seen == [b"before"], 20, "the first message")
    ep.stop()
    ep.send("Input", b"while stopped")
    time.sleep(1.0)
    assert seen == [b"before"]
    ep.start(lambda msg, send: seen.append(msg.body))
    wait_for(lambda: seen == [b"before", b"while stopped"], 20, "the message sent while stopped")


def test_stop_while_a_message_is_in_flight_finishes_it(faces: Callable[..., Face]) -> None:
    entered, done = threading.Event(), []

    def logic(msg: TransportMessage, send: Send) -> None:
        entered.set()
        time.sleep(1.0)
        send("Output", b"finished")
        done.append(msg.id)

    out = faces("Output")
    ep = faces("Input", concurrency="fixed", max_concurrency=1).start(logic)
    ep.send("Input", b"x")
    assert entered.wait(20)
    ep.stop()  # waits for the handler and its commit
    assert len(done) == 1
    assert [m.body for m in received(out, 1, 10)] == [b"finished"]


def test_unicode_in_headers(faces: Callable[..., Face]) -> None:
    seen: list[TransportMessage] = []
    ep = faces("Input").start(lambda msg, send: seen.append(msg))
    headers = {"Ünïcødé ключ": "値 ✓ 🚀", "NServiceBus.EnclosedMessageTypes": "Ordén.Créé, Ventes"}
    ep.send("Input", b"x", headers)
    wait_for(lambda: seen, 20, "the message")
    assert {k: seen[0].headers[k] for k in headers} == headers


def test_a_send_only_endpoint_sends_and_does_not_receive(faces: Callable[..., Face]) -> None:
    seen: list[bytes | None] = []
    faces("Input").start(lambda msg, send: seen.append(msg.body))
    sender = faces("Client", send_only=True)
    sender.send("Input", b"from a send-only endpoint")
    wait_for(lambda: seen == [b"from a send-only endpoint"], 20, "its message")
    with pytest.raises(InvalidArgumentError, match="send-only"):
        sender.start(lambda msg, send: None)


def test_receive_only_sends_only_for_a_handler_that_returns(faces: Callable[..., Face]) -> None:
    calls: list[bytes | None] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        calls.append(msg.body)
        send("Output", msg.body)
        if len(calls) == 1:
            raise RuntimeError("first time")

    out = faces("Output")
    ep = faces("Input", transaction_mode="ReceiveOnly").start(logic)
    ep.send("Input", b"fails once")
    assert [m.body for m in received(out, 2, 8.0)] == [b"fails once"]
    assert calls == [b"fails once", b"fails once"]


def test_transaction_mode_none_removes_first_and_sends_from_on_error(faces: Callable[..., Face]) -> None:
    calls: list[bytes | None] = []

    def logic(msg: TransportMessage, send: Send) -> None:
        calls.append(msg.body)
        send("Output", b"dropped")
        if msg.body == b"fails":
            raise RuntimeError("in mode None")
        send("Output", msg.body)

    def on_error(ctx: ErrorContext, send: Send) -> ErrorResult:
        send("Output", b"from on_error")
        return ErrorResult.RETRY  # not possible in mode None: the message is already gone

    out = faces("Output")
    ep = faces("Input", transaction_mode="None", on_error=on_error).start(logic)
    ep.send("Input", b"fails")
    ep.send("Input", b"fine")
    got = sorted(m.body or b"" for m in received(out, 4, 8.0))
    assert got == [b"dropped", b"fine"]  # on_error's send goes with HANDLED only; RETRY cannot be
    assert sorted(c or b"" for c in calls) == [b"fails", b"fine"]
    assert ep.sync.stats()["counters"]["lost"] == 1
