"""ListTransactions (Kafka API key 66, version 0) spoken directly on the wire: confluent-kafka's
admin client has no list/describe-transactions call. Sent to one broker, the answer lists the
transactional ids that broker coordinates, so asking each node in turn says which node is the
transaction coordinator of which producer."""

from __future__ import annotations

import socket
import struct

from kbroker.core.offsets import put_uvarint

LIST_TRANSACTIONS, VERSION = 66, 0


def _uvarint(value: int) -> bytes:
    out = bytearray()
    put_uvarint(value, out)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def compact_string(self) -> str | None:
        length = self.uvarint() - 1
        if length < 0:
            return None
        text = self.data[self.pos:self.pos + length].decode()
        self.pos += length
        return text

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.pos += self.uvarint()  # its size, then its bytes


def list_transactions_request(correlation_id: int, client_id: str = "kbroker-tests") -> bytes:
    """The framed request: header v2 (non-compact client id, no tags), then an empty states
    filter and an empty producer-id filter (all transactions), no tags."""
    client = client_id.encode()
    header = struct.pack(">hhih", LIST_TRANSACTIONS, VERSION, correlation_id, len(client)) + client + b"\x00"
    body = _uvarint(1) + _uvarint(1) + b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def parse_list_transactions(payload: bytes, correlation_id: int) -> dict[str, str]:
    """transactional id -> state, from a response without its size prefix; raises on an error code."""
    r = _Reader(payload)
    assert r.take(">i") == correlation_id, "a response to another request"
    r.skip_tags()  # response header v1
    r.take(">i")  # throttle time
    error = r.take(">h")
    if error:
        raise RuntimeError(f"ListTransactions failed with Kafka error code {error}")
    for _ in range(r.uvarint() - 1):  # unknown state filters
        r.compact_string()
    states: dict[str, str] = {}
    for _ in range(r.uvarint() - 1):
        transactional_id = r.compact_string()
        r.take(">q")  # producer id
        state = r.compact_string()
        r.skip_tags()
        if transactional_id is not None:
            states[transactional_id] = state or ""
    return states


def list_transactions(host: str, port: int, timeout: float = 10.0) -> dict[str, str]:
    """The transactions the broker at host:port coordinates: transactional id -> state."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(list_transactions_request(1))
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        return parse_list_transactions(_read_exactly(sock, size), 1)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection mid-response")
        buf += chunk
    return bytes(buf)
