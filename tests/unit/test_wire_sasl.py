"""kbroker's wire client against whatever answers its SASL exchange: a broker's refusal, and
answers no broker would give (garbage, a cut-off frame, a SCRAM answer that is not SCRAM). Each
ends in a typed error within the deadline, with the socket closed; none hangs or escapes as a
parsing error. A one-connection server on 127.0.0.1 plays the broker."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from kbroker.core.cluster import Cluster
from kbroker.errors import AuthenticationFailedError
from kbroker.kafka import wire

SCRAM = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "app",
    "sasl.password": "pw",
}


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


HANDSHAKE_OK = frame(struct.pack(">ih", 1, 0) + struct.pack(">i", 1) + struct.pack(">h", 13) + b"SCRAM-SHA-512")


def authenticate_reply(error: int, message: bytes | None, auth: bytes) -> bytes:
    msg = struct.pack(">h", -1) if message is None else struct.pack(">h", len(message)) + message
    return frame(struct.pack(">ih", 2, error) + msg + struct.pack(">i", len(auth)) + auth + struct.pack(">q", 0))


def serve(answers: list[bytes]) -> tuple[int, threading.Thread]:
    """A server that reads one request per answer and writes the answer, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            for answer in answers:
                size = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))[0]
                conn.recv(size, socket.MSG_WAITALL)
                conn.sendall(answer)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t


@pytest.mark.parametrize(
    "answers, error",
    [
        ([frame(b"\x00\x00\x00\x01")], ConnectionError),  # a handshake answer cut short
        ([frame(b"\xff" * 3)], ConnectionError),  # garbage
        ([HANDSHAKE_OK, authenticate_reply(0, None, b"not a scram message")], AuthenticationFailedError),
        ([HANDSHAKE_OK, authenticate_reply(58, b"Authentication failed", b"")], AuthenticationFailedError),
        ([HANDSHAKE_OK, frame(struct.pack(">ih", 2, 0) + struct.pack(">h", 400) + b"x")], ConnectionError),
        ([b""], ConnectionError),  # the other side closes at once
    ],
)
def test_what_answers_sasl_is_read_as_untrusted(answers, error):
    port, server = serve(answers)
    with pytest.raises(error):
        wire.connect(Cluster.with_properties(f"127.0.0.1:{port}", SCRAM), None, 5)
    server.join(5)
    assert not server.is_alive()


def test_a_handshake_refusing_the_mechanism_names_what_the_broker_offers():
    offered = struct.pack(">i", 1) + struct.pack(">h", 5) + b"PLAIN"
    port, _ = serve([frame(struct.pack(">ih", 1, 33) + offered)])
    with pytest.raises(AuthenticationFailedError, match="PLAIN"):
        wire.connect(Cluster.with_properties(f"127.0.0.1:{port}", SCRAM), None, 5)
