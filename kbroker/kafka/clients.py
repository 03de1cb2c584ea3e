"""The one place kbroker builds Kafka clients: every producer, consumer and admin client starts
from the same base settings (the cluster's bootstrap servers and client properties, librdkafka's
log routed to kbroker's logger), so a setting that must hold everywhere is set once; the Faust
worker's broker URL and the Spark job's Kafka options are made here from the same Cluster.
`kafka_error` (a Kafka failure as a typed kbroker error) lives with the errors and is re-exported
here for the layer's modules."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.metadata
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kbroker.config import KAFKA_LOG
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.log_limit import RateLimitFilter
from kbroker.core.security.client_security import ClientSecurity
from kbroker.core.topic_limits import CLIENT_LIMIT
from kbroker.errors import (
    AUTHENTICATION_CODES,
    BrokerUnavailableError,
    InvalidArgumentError,
    KBrokerError,
    SendFailedError,
    denied_code,
)
from kbroker.errors import kafka_error as kafka_error  # re-exported for the layer's modules
from kbroker.kafka.tls import ssl_context

# librdkafka logs every failed connection attempt of every client (thousands of lines a second
# while a broker is down): each repeating line is written once per window, with a count.
KAFKA_LOG_LIMIT = RateLimitFilter(always=(KAFKA_LOG.name,))
if not any(isinstance(f, RateLimitFilter) for f in KAFKA_LOG.filters):
    KAFKA_LOG.addFilter(KAFKA_LOG_LIMIT)

MAX_MESSAGE_BYTES = CLIENT_LIMIT  # the largest record any kbroker topic takes, and a request's overhead

# Errors that say the cluster cannot be reached now; librdkafka reconnects by itself.
_RECONNECTING = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)


READ_AHEAD_KBYTES = 4_096  # per consumer; a queue reader's own is larger (receive/poll_loop.py)
FETCH_QUEUE_BACKOFF_MS = 10  # the wait for room in that read-ahead before the next fetch


def is_transient(err: KafkaError) -> bool:
    """Whether a consumer's error event is one librdkafka recovers from by itself (a lost
    connection, brokers down for a moment): a reader keeps polling rather than failing. An
    authorization failure never is: it stays until an operator grants the ACL."""
    return not denied_code(err) and not err.fatal() and (err.retriable() or err.code() in _RECONNECTING)


@functools.lru_cache(maxsize=32)
def _security(cluster: Cluster) -> ClientSecurity:
    return ClientSecurity.of(cluster.properties, lambda path: Path(path).read_bytes())


def security(cluster: ClusterLike) -> ClientSecurity:
    """The cluster's client properties read into one value (files they name read once per
    process); UnsupportedSettingError or InvalidArgumentError for settings kbroker cannot use."""
    return _security(Cluster.of(cluster))


def principal(cluster: ClusterLike) -> str:
    """Who `cluster` takes kbroker's clients for, as its ACLs name principals (User:alice);
    for messages that say who was refused."""
    try:
        return security(cluster).principal
    except InvalidArgumentError:  # settings that cannot be read fail where a client is made
        return ""


def denied(where: ClusterLike, err: KafkaError, what: str, **on: tuple[str, str]) -> KBrokerError:
    """kafka_error with the principal `where` (the cluster) knows kbroker as, so that a refusal
    names who was refused; `on`: kind of resource (topic, group, transactional_id, cluster) ->
    (operation, name)."""
    return kafka_error(what, err, on={kind.replace("_", " "): v for kind, v in on.items()}, principal=principal(where))


def reading_refused(cluster: ClusterLike, what: str, topic: str, group: str) -> Callable[[KafkaError], KBrokerError]:
    """What a service's consumer makes of the authorizer's refusal (messages.records'
    `refused`): a PermissionDeniedError naming READ on `topic` and on its `group`."""
    return lambda err: denied(cluster, err, what, topic=("READ", topic), group=("READ", group))


def flush(producer: Producer, seconds: float) -> int:
    """Producer.flush: how many records are still not acknowledged after `seconds`. A producer
    that failed for good (a fatal error: the cluster refused it a producer id) raises its
    KafkaException, which the binding otherwise wraps in a SystemError when a delivery callback
    runs while it is set."""
    try:
        return int(producer.flush(seconds))
    except SystemError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KafkaException):
            raise cause from None
        raise


def librdkafka_settings(cluster: ClusterLike) -> dict[str, Any]:
    """The cluster as librdkafka's settings: its bootstrap servers and security settings."""
    c = Cluster.of(cluster)
    return {"bootstrap.servers": c.bootstrap, **security(c).librdkafka()}


def base(cluster: ClusterLike, **overrides: Any) -> dict[str, Any]:
    """The settings every client shares, plus `overrides`."""
    return {**librdkafka_settings(cluster), "logger": KAFKA_LOG, **overrides}


def producer(cluster: ClusterLike, **overrides: Any) -> Producer:
    """A producer with librdkafka's defaults (views, reader reports, benchmarks' baselines)."""
    return Producer(base(cluster, **overrides))


def idempotent_producer(cluster: ClusterLike, **overrides: Any) -> Producer:
    """A producer whose acknowledged messages are durable and never duplicated by its retries:
    what SEND outside a transaction uses."""
    return Producer(
        base(
            cluster,
            **{
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "message.max.bytes": MAX_MESSAGE_BYTES,
                **overrides,
            },
        )
    )


def transactional_producer(cluster: ClusterLike, prefix: str, **overrides: Any) -> Producer:
    """An idempotent producer with a fresh transactional id under `prefix` (init_transactions is
    the caller's, with its own deadline)."""
    return idempotent_producer(cluster, **{"transactional.id": f"{prefix}.{uuid.uuid4()}", **overrides})


def consumer(cluster: ClusterLike, group_id: str, **overrides: Any) -> Consumer:
    """A consumer that commits nothing by itself and reads committed records only. `group_id`
    is named under the namespace's prefix, even for assign()-only reading (names.reader_group),
    so the namespace's ACLs cover it."""
    return Consumer(
        base(
            cluster,
            **{
                "group.id": group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # librdkafka reads ahead up to 64 MiB a consumer by default, outside Python's heap:
                # with a process's dozen consumers, most of its memory (docs/endpoints.md).
                "queued.max.messages.kbytes": READ_AHEAD_KBYTES,
                # Once that read-ahead is full, librdkafka waits this long before fetching again
                # (1,000 ms by default): a catch-up read of a large topic then ran at about 4 MB/s.
                "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                **overrides,
            },
        )
    )


def admin(cluster: ClusterLike, **overrides: Any) -> AdminClient:
    """An admin client (topics, configs, consumer groups' offsets)."""
    return AdminClient(base(cluster, **overrides))


def faust_broker(cluster: ClusterLike) -> str:
    """The cluster as a Faust broker URL (`kafka://host:port;kafka://...`)."""
    return ";".join(f"kafka://{h.strip()}" for h in Cluster.of(cluster).bootstrap.split(",") if h.strip())


def aiokafka_settings(cluster: ClusterLike) -> dict[str, Any]:
    """The cluster's security as the worker's aiokafka takes it: protocol, SASL mechanism and
    credentials, and an ssl.SSLContext (`ssl_context`, None without TLS)."""
    sec = security(cluster)
    return {**sec.aiokafka(), "ssl_context": ssl_context(sec) if sec.tls else None}


def spark_options(cluster: ClusterLike) -> dict[str, str]:
    """The cluster as options of Spark's Kafka source and sink (`kafka.`-prefixed Java client
    properties)."""
    c = Cluster.of(cluster)
    return {"kafka.bootstrap.servers": c.bootstrap, **{f"kafka.{k}": v for k, v in security(c).java().items()}}


def spark_java_options(cluster: ClusterLike) -> list[str]:
    """JVM options Spark's Kafka clients need for the cluster: Kafka's Java client calls only
    the OAuth token endpoints a system property allows."""
    oauth = security(cluster).oauth
    return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={oauth.token_url}"] if oauth else []


def consume_soon(consumer: Consumer, most: int, wait: float) -> list[Any]:
    """Up to `most` records, returning as soon as one is there (at most `wait` seconds).
    Consumer.consume(most, wait) waits out `wait` unless `most` records come: a service that
    forwards what it reads (transmitter, dispatcher) added half its poll interval to every hop."""
    got = consumer.consume(most, 0)
    if not got and wait > 0:
        got = consumer.consume(1, wait)
        if got and most > 1:
            got += consumer.consume(most - 1, 0)
    return got


def produce(producer: Producer, topic: str, *, until: Callable[[], bool] = lambda: False, **kwargs: Any) -> None:
    """Producer.produce that waits, instead of failing, while librdkafka's local queue is full:
    back-pressure from the broker reaches the caller. `until`: when to stop waiting (a deadline
    passed); the wait then ends with a _TIMED_OUT KafkaException."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            if until():
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "local produce queue full")) from None
            producer.poll(0.01)


def produce_within(producer: Producer, topic: str, seconds: float, **kwargs: Any) -> None:
    """produce() for a statement outside a transaction: waits at most `seconds` while the local
    queue is full (the broker is away and earlier messages are still queued), then raises
    SendFailedError instead of librdkafka's BufferError."""
    until = time.monotonic() + seconds
    try:
        produce(producer, topic, until=lambda: time.monotonic() >= until, **kwargs)
    except KafkaException as exc:
        raise SendFailedError(f"Kafka did not take the message within {seconds:g} s: {exc.args[0].str()}") from None


def result_of(future: Any, what: str) -> Any:
    """An admin call's future's result, or its Kafka failure as a typed kbroker error saying
    `what` could not be done."""
    try:
        return future.result()
    except KafkaException as exc:
        raise kafka_error(what, exc.args[0]) from None


# What a broker answers for a topic created a moment ago, before it leads every partition: its
# metadata may already name it leader (apply's propagation wait sees that) while its replica
# manager has not taken the partition over. librdkafka flags none of them retriable here.
T = TypeVar("T")

_NOT_LED_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


def not_led_yet(err: KafkaError) -> bool:
    return err.code() in _NOT_LED_YET


def asked_until(
    deadline: float,
    ask: Callable[[], T],
    again: Callable[[KafkaError], bool],
    what: str,
    on: Mapping[str, tuple[str, str]] | None = None,
) -> T:
    """ask()'s answer, asking again every 0.1 s while it fails with an error `again` accepts and
    `deadline` (time.monotonic()) has not passed; any other failure, or that one at the deadline,
    as a typed error saying `what` (kafka_error, with `on`)."""
    while True:
        try:
            return ask()
        except KafkaException as exc:
            err = exc.args[0]
            if not again(err) or time.monotonic() >= deadline:
                raise kafka_error(what, err, on=on) from None
        time.sleep(0.1)


def end_offsets(admin: AdminClient, topic: str, partitions: list[int], deadline: float) -> dict[int, int]:
    """Each partition's end offset, asked again while its leader is not yet leading it (until
    `deadline`); any other failure, or that one at the deadline, as a typed error."""
    tps = [TopicPartition(topic, p) for p in partitions]

    def ask() -> dict[int, int]:
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, request_timeout=max(0.1, deadline - time.monotonic())
        )
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    return asked_until(deadline, ask, not_led_yet, f"cannot list the offsets of {topic}")


class AuthFailures:
    """An `error_cb` (and a `logger`) that keeps the last authentication or TLS failure a client
    reported. A refused password or certificate looks like a broker that is away: librdkafka
    keeps reconnecting, its requests time out, and only the error callback says why. A broker
    whose listener wants TLS closes a plaintext client's connection at its first request, which
    only librdkafka's log says ("... in state APIVERSION_QUERY")."""

    def __init__(self) -> None:
        self.last: KafkaError | None = None
        self.refusals = 0
        self.closed_at_first_request = 0

    def __call__(self, err: KafkaError) -> None:
        if err.code() in AUTHENTICATION_CODES:
            self.last, self.refusals = err, self.refusals + 1

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """librdkafka's log line, counted, then passed on to kbroker's Kafka logger."""
        line = fmt % args if args else fmt
        if "state APIVERSION_QUERY" in line and "Disconnected" in line:
            self.closed_at_first_request += 1
        KAFKA_LOG.log(level, "%s", line)


def broker_nodes(client: AdminClient, timeout: float) -> list[Any]:
    """The cluster's brokers (confluent_kafka Nodes: id, host, port) from a metadata request
    naming no topic (DescribeCluster): an answer about every topic would cost the broker, and
    this process, every topic of the cluster. KafkaException or concurrent.futures.TimeoutError
    when none answers within `timeout`."""
    return list(client.describe_cluster(request_timeout=timeout).result(timeout + 5).nodes)


_TOLD = 2  # refusals, or plaintext connections closed at their first request, before saying so


def brokers_answering(
    cluster: ClusterLike, timeout: float = 10.0, client: AdminClient | None = None, failures: AuthFailures | None = None
) -> int:
    """How many brokers `cluster` lists in a metadata answer within `timeout`.
    AuthenticationFailedError when none answers and `failures` (the error_cb given to `client`;
    its own when no client is given, then at the first refusal) saw the cluster refuse the
    credentials or the TLS handshake; BrokerUnavailableError naming the protocol when the
    brokers close a plaintext client's connections (a TLS listener), else BrokerUnavailableError."""
    own = client is None
    if client is None:
        failures = failures or AuthFailures()
        client = admin(cluster, error_cb=failures, logger=failures)
    future = client.describe_cluster(request_timeout=timeout)
    deadline = time.monotonic() + timeout + 5
    while True:
        try:
            return len(future.result(timeout=0.25 if own else max(0.0, deadline - time.monotonic())).nodes)
        except KafkaException as exc:
            raise _not_answering(cluster, client, failures, exc.args[0].str()) from None
        except concurrent.futures.TimeoutError:
            client.poll(0)  # error_cb and the logger run from poll()
            # Told twice (a handshake cut by a restarting broker is told once), the answer stands.
            told = 0 if failures is None else max(failures.refusals, failures.closed_at_first_request)
            early = own and told >= _TOLD
            if early or time.monotonic() >= deadline:
                raise _not_answering(cluster, client, failures, f"no answer in {timeout:g} s") from None


def _not_answering(cluster: ClusterLike, client: AdminClient, failures: AuthFailures | None, why: str) -> KBrokerError:
    if failures is not None:
        client.poll(0)
        if failures.last is not None:
            return kafka_error(f"Kafka at {cluster} refused kbroker", failures.last)
        protocol = str(librdkafka_settings(cluster).get("security.protocol", "plaintext")).upper()
        if failures.closed_at_first_request and protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            return BrokerUnavailableError(
                f"Kafka at {cluster} answers but closes {protocol} connections at their first request: "
                "its listener wants TLS (security.protocol SSL or SASL_SSL); give kbroker the "
                "cluster's client properties (--command-config FILE)"
            )
    return BrokerUnavailableError(f"no Kafka broker answers at {cluster}: {why}")


def refusal(cluster: ClusterLike, timeout: float = 5.0) -> KBrokerError | None:
    """Why `cluster` fails kbroker's clients though a broker listens at its first bootstrap
    address: the credentials or the TLS handshake refused, or a TLS listener closing plaintext
    connections. None when nothing listens there or nothing of the kind was seen. A client that
    met only a transport failure ("Broker transport failure") is explained by it."""
    host, _, port = Cluster.of(cluster).bootstrap.split(",")[0].strip().rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except (OSError, ValueError):
        return None
    failures = AuthFailures()
    try:
        brokers_answering(cluster, timeout, failures=failures)
    except KBrokerError as exc:
        return exc if failures.last is not None or failures.closed_at_first_request else None
    return None


def library_versions() -> tuple[str, str]:
    """(confluent-kafka's version, librdkafka's version): what a benchmark reports it ran with."""
    try:
        package = importlib.metadata.version("confluent-kafka")
    except importlib.metadata.PackageNotFoundError:
        package = "?"
    return package, confluent_kafka.libversion()[0]
