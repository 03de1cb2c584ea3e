"""Kafka requests that confluent-kafka's admin client does not offer, spoken on the wire: one
request, one response, on a connection of its own to a broker of a Cluster. Today:
DescribeLogDirs, for the bytes a queue topic holds (`kbroker queue show`). The framing (request
header, response reader) is shared with the tests' own requests.

Every connection opens in `connect` from the Cluster, with the cluster's security settings: TLS
(the same CA and client certificate as every other client) and SASL PLAIN or SCRAM (SaslHandshake
v1 and SaslAuthenticate v1, SCRAM's exchange computed by `scramp`). OAUTHBEARER is refused here
(UnsupportedSettingError): what asks for log-dir sizes shows none then."""

from __future__ import annotations

import functools
import socket
import ssl
import struct

import scramp

from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.receive.offsets import put_uvarint
from kbroker.core.security.client_security import ClientSecurity
from kbroker.errors import AuthenticationFailedError
from kbroker.kafka.clients import security
from kbroker.kafka.tls import ssl_context

DESCRIBE_LOG_DIRS = 35
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
CLIENT_ID = b"kbroker"


class Cursor:
    """Reads a response's fields in order (Kafka's big-endian and varint encodings)."""

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

    def string(self) -> str | None:
        length = self.take(">h")
        return self._text(length)

    def compact_string(self) -> str | None:
        return self._text(self.uvarint() - 1)

    def _text(self, length: int) -> str | None:
        if length < 0:
            return None
        text = self.data[self.pos : self.pos + length].decode()
        self.pos += length
        return text

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.pos += self.uvarint()  # its size, then its bytes


def uvarint(value: int) -> bytes:
    out = bytearray()
    put_uvarint(value, out)
    return bytes(out)


def frame(api_key: int, version: int, correlation_id: int, body: bytes, *, flexible: bool) -> bytes:
    """A sized request: header v1 (v2, with an empty tag section, for flexible versions), then `body`."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    if flexible:
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


Node = tuple[str, int]  # a broker's (host, port), as the cluster's metadata names it


def servers(cluster: ClusterLike) -> list[Node]:
    """The cluster's bootstrap servers as (host, port): `host:port` entries separated by commas,
    each perhaps with a listener prefix (`PLAINTEXT://`) or an IPv6 host in brackets."""
    found: list[Node] = []
    for entry in Cluster.of(cluster).bootstrap.split(","):
        entry = entry.strip().rpartition("://")[2]
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"a bootstrap server is host:port, not {entry!r}")
        found.append((host.strip("[]"), int(port)))
    if not found:
        raise ValueError(f"no bootstrap server in {Cluster.of(cluster).bootstrap!r}")
    return found


def connect(cluster: ClusterLike, node: Node | None, timeout: float) -> socket.socket:
    """A connection to `node` of `cluster` (a broker its metadata names), or to the first of its
    bootstrap servers that answers when `node` is None, secured and authenticated as the
    cluster's settings say. The one place a socket opens. AuthenticationFailedError when the
    broker refuses the credentials or the TLS handshake fails; ConnectionError when what
    answers the SASL exchange is not a Kafka broker's answer."""
    sec = security(cluster)
    sec.wire()
    last: OSError | None = None
    for host, port in [node] if node is not None else servers(cluster):
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            last = exc
            continue
        sock.settimeout(timeout)
        try:
            if sec.tls:
                sock = _context(sec).wrap_socket(sock, server_hostname=host)
            if sec.sasl:
                _authenticate(sock, sec)
        except ssl.SSLError as exc:
            sock.close()
            raise AuthenticationFailedError(f"TLS with {host}:{port} failed: {exc.reason or exc}") from None
        except (struct.error, IndexError, UnicodeDecodeError) as exc:  # whatever answered, it was no broker
            sock.close()
            raise ConnectionError(f"an unreadable answer to SASL from {host}:{port} ({type(exc).__name__})") from None
        except BaseException:
            sock.close()
            raise
        return sock
    assert last is not None
    raise last


_context = functools.lru_cache(maxsize=8)(ssl_context)


def _authenticate(sock: socket.socket, sec: ClientSecurity) -> None:
    """SASL on a fresh connection: the handshake naming the mechanism, then PLAIN's one message or
    SCRAM's two rounds."""
    mechanism = str(sec.mechanism)
    reply = Cursor(_round_trip(sock, frame(SASL_HANDSHAKE, 1, 1, _string(mechanism), flexible=False)))
    reply.take(">i")  # correlation id
    if reply.take(">h"):
        offered = [reply.string() for _ in range(reply.take(">i"))]
        raise AuthenticationFailedError(f"the broker does not take SASL {mechanism} (it offers {offered})")
    user, password = str(sec.username), str(sec.password)
    if mechanism == "PLAIN":
        _sasl_step(sock, b"\0" + user.encode() + b"\0" + password.encode())
        return
    client = scramp.ScramClient([mechanism], user, password)
    try:
        client.set_server_first(_sasl_step(sock, client.get_client_first().encode()).decode())
        client.set_server_final(_sasl_step(sock, client.get_client_final().encode()).decode())
    except scramp.ScramException as exc:
        raise AuthenticationFailedError(f"SASL {mechanism}: {exc}") from None


def _sasl_step(sock: socket.socket, data: bytes) -> bytes:
    """One SaslAuthenticate v1 round: `data` out, the broker's bytes back."""
    reply = Cursor(
        _round_trip(sock, frame(SASL_AUTHENTICATE, 1, 2, struct.pack(">i", len(data)) + data, flexible=False))
    )
    reply.take(">i")  # correlation id
    error, message = reply.take(">h"), reply.string()
    if error:
        raise AuthenticationFailedError(f"the broker refused the credentials: {message or f'error {error}'}")
    size = reply.take(">i")
    return reply.data[reply.pos : reply.pos + max(size, 0)]


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _round_trip(sock: socket.socket, request: bytes) -> bytes:
    sock.sendall(request)
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)


def exchange(cluster: ClusterLike, request: bytes, timeout: float, *, node: Node | None = None) -> bytes:
    """Send one framed request to `node` of `cluster` (a bootstrap server when None); the
    response without its size prefix."""
    with connect(cluster, node, timeout) as sock:
        return _round_trip(sock, request)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection mid-response")
        buf += chunk
    return bytes(buf)


def describe_log_dirs_request(topic: str, partitions: list[int], correlation_id: int = 1) -> bytes:
    """DescribeLogDirs v1 (not flexible) for one topic's partitions."""
    name = topic.encode()
    body = struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return frame(DESCRIBE_LOG_DIRS, 1, correlation_id, body, flexible=False)


def parse_describe_log_dirs(payload: bytes, topic: str, correlation_id: int = 1) -> dict[int, int]:
    """partition -> bytes on this broker (current replicas, not a move's future ones)."""
    r = Cursor(payload)
    if r.take(">i") != correlation_id:
        raise ConnectionError("a response to another request")
    r.take(">i")  # throttle time
    sizes: dict[int, int] = {}
    for _ in range(r.take(">i")):
        error = r.take(">h")
        r.string()  # the log dir
        for _ in range(r.take(">i")):
            name = r.string()
            for _ in range(r.take(">i")):
                partition, size = r.take(">i"), r.take(">q")
                r.take(">q")  # offset lag
                future = r.take(">b")
                if not error and name == topic and not future:
                    sizes[partition] = sizes.get(partition, 0) + size
    return sizes


def partition_sizes(
    cluster: ClusterLike, topic: str, partitions: list[int], timeout: float, *, node: Node | None = None
) -> dict[int, int]:
    """The bytes each of `partitions` of `topic` takes on broker `node` of `cluster` (the
    bootstrap server that answers when None)."""
    request = describe_log_dirs_request(topic, partitions)
    return parse_describe_log_dirs(exchange(cluster, request, timeout, node=node), topic)
