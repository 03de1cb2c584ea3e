"""Typed errors. Every error names what is wrong; `retriable` says whether the same call may
succeed later without the caller changing anything (a broker that is still starting, a lost
connection), as opposed to input that will be refused every time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KBrokerError(Exception):
    """Base of every kbroker error."""

    retriable = False


# --- infrastructure -----------------------------------------------------------------------


class BrokerUnavailableError(KBrokerError):
    """No Kafka broker answered at the bootstrap address."""

    retriable = True


# librdkafka's local error codes that mean no broker could be reached (confluent_kafka.KafkaError
# names them; this module must not import the Kafka client, so the numbers are spelled out):
# _TRANSPORT (-195, the connection failed), _TIMED_OUT (-185), _ALL_BROKERS_DOWN (-187),
# _MSG_TIMED_OUT (-192, a message expired waiting for a broker). With them Kafka's own codes of a
# group coordinator moving or starting (COORDINATOR_LOAD_IN_PROGRESS 14, COORDINATOR_NOT_AVAILABLE
# 15, NOT_COORDINATOR 16: what a broker restart answers for a while), which librdkafka does not
# always flag retriable when a call returns them.
UNREACHABLE_CODES = frozenset({-195, -185, -187, -192, 14, 15, 16})


def kafka_error(
    what: str, err: Any, *, on: Mapping[str, tuple[str, str]] | None = None, principal: str = ""
) -> KBrokerError:
    """A Kafka failure as a typed error: BrokerUnavailableError when trying later may help,
    PermissionDeniedError when the authorizer refused, named by what the call site knows: `on`
    maps the kind of resource Kafka's code names ("topic", "group", "transactional id",
    "cluster") to (the operation, the resource's name), e.g. {"topic": ("WRITE", topic)}.

    `err` is a confluent_kafka KafkaError (anything with retriable(), code() and str()); any other
    exception counts as unreachable, since it did not come with a verdict from the broker."""
    retriable, code, text = (getattr(err, name, None) for name in ("retriable", "code", "str"))
    if callable(code) and callable(text) and code() in DENIED_CODES:
        kind = DENIED_CODES[code()]
        operation, name = (on or {}).get(kind, ("", ""))
        return PermissionDeniedError(
            resource=f"{kind} {name}" if name else "", operation=operation, principal=principal, what=what, kind=kind
        )
    if callable(code) and callable(text) and code() in AUTHENTICATION_CODES:
        return AuthenticationFailedError(f"{what}: {text()}")
    if not (callable(retriable) and callable(code) and callable(text)) or retriable() or code() in UNREACHABLE_CODES:
        return BrokerUnavailableError(f"{what}: {err}")
    return KBrokerError(f"{what}: {text()}")


def denied_code(err: Any) -> bool:
    """Whether a Kafka error (a KafkaError, or an aiokafka error with its `errno`) is the
    authorizer's refusal: never transient, whatever the client library says."""
    code = getattr(err, "code", None)
    number = code() if callable(code) else getattr(err, "errno", None)
    return number in DENIED_CODES


def is_refusal(exc: BaseException) -> bool:
    """Whether `exc` is the authorizer's refusal: a PermissionDeniedError, a client library's
    authorization error (aiokafka's carry `errno`), or a confluent_kafka KafkaException of one.
    Such a failure is not retried: it stands until an operator grants the ACL."""
    if isinstance(exc, PermissionDeniedError) or denied_code(exc):
        return True
    first = exc.args[0] if exc.args else None
    return callable(getattr(first, "code", None)) and denied_code(first)


class AuthenticationFailedError(KBrokerError):
    """The cluster refused kbroker's credentials or its TLS handshake failed (a wrong password,
    an unknown user, a certificate the other side does not trust). Trying again does not help."""


class PermissionDeniedError(KBrokerError):
    """The cluster's authorizer refused an operation to kbroker's principal (no ACL grants it).
    Trying again does not help until an operator grants it.

    Its message is one line naming the principal, the operation and the resource as far as the
    code that met the refusal knows them (`kind`: the kind of resource Kafka's error code names,
    when the resource itself is not known); `naming(principal)` fills in the principal later."""

    retriable = False

    def __init__(
        self,
        message: str = "",
        *,
        resource: str = "",
        operation: str = "",
        principal: str = "",
        what: str = "",
        kind: str = "",
    ):
        self.resource, self.operation, self.principal = resource or (f"a {kind}" if kind else ""), operation, principal
        self.what, self._given = what, message
        super().__init__(message or self.line())

    def line(self) -> str:
        """`permission denied: <principal> may not <operation> <resource> (<what was being done>)`."""
        who = self.principal or "this client's principal"
        head = f"permission denied: {who} may not {self.operation or 'use'} {self.resource or 'a resource'}"
        return f"{head} ({self.what})" if self.what else head

    def naming(self, principal: str | None) -> "PermissionDeniedError":
        """This error with `principal` filled in when it named none (the same error otherwise)."""
        if self.principal or not principal:
            return self
        return PermissionDeniedError(
            self._given, resource=self.resource, operation=self.operation, principal=principal, what=self.what
        )


class SendPermissionDeniedError(PermissionDeniedError):
    """BEGIN DIALOG or SEND to a service whose queue this principal may not write: no SEND ON
    SERVICE grant, or a DENY (core/security/permissions.py). Service Broker's error 8494, as `number`.
    Raised before anything of the statement is written."""

    number = -8494  # Service Broker: "You do not have permission to access the service"

    def __init__(self, service: str, topic: str, principal: str = ""):
        self.service, self.topic = service, topic
        super().__init__(
            resource=f"topic {topic}",
            operation="WRITE",
            principal=principal,
            what=f"error {self.number}: no SEND permission on service {service!r}",
        )

    def naming(self, principal: str | None) -> "PermissionDeniedError":
        """This error with `principal` filled in when it named none (the same error otherwise)."""
        return (
            self if self.principal or not principal else SendPermissionDeniedError(self.service, self.topic, principal)
        )


# Kafka's authorization failures by error code: the kind of resource each one names.
DENIED_CODES = {29: "topic", 30: "group", 31: "cluster", 53: "transactional id", 65: "delegation token"}
# SASL_AUTHENTICATION_FAILED (58), UNSUPPORTED_SASL_MECHANISM (33), ILLEGAL_SASL_STATE (34) and
# librdkafka's local _AUTHENTICATION (-169) and _SSL (-181).
AUTHENTICATION_CODES = frozenset({58, 33, 34, -169, -181})


class EmbeddedBrokerError(KBrokerError):
    """The embedded Apache Kafka broker could not be fetched, started or stopped."""


class JavaMissingError(EmbeddedBrokerError):
    """No Java runtime to start the embedded broker with."""


class MavenMissingError(EmbeddedBrokerError):
    """No Maven to fetch the embedded broker's jars with."""


class RepositoryUnreachableError(EmbeddedBrokerError):
    """The repository holding the embedded broker's jars did not answer."""

    retriable = True


class PortInUseError(EmbeddedBrokerError):
    """A port the embedded broker needs is taken by another process."""


# --- arguments ----------------------------------------------------------------------------


class InvalidArgumentError(KBrokerError, ValueError):
    """A statement's argument is out of its range or contradicts another (a negative lifetime, a
    priority outside 1-10, ...). Also a ValueError, as such arguments are in Python."""


class UnsupportedSettingError(InvalidArgumentError):
    """A Kafka client setting kbroker cannot give one of the clients it runs (librdkafka, the
    worker's aiokafka, Spark's Kafka source, its own protocol client): refused at start-up
    rather than connecting without it."""

    def __init__(self, setting: str, client: str, why: str = ""):
        super().__init__(f"kbroker cannot give the setting {setting} to {client}" + (f": {why}" if why else ""))
        self.setting, self.client = setting, client


class TransportQueueNotFoundError(InvalidArgumentError):
    """A send to a transport queue that no installer created (`kbroker endpoint install`)."""

    def __init__(self, queue: str, topic: str):
        super().__init__(
            f"transport queue {queue!r} does not exist (topic {topic}), or this principal may not "
            f"DESCRIBE it: install its endpoint first (kbroker endpoint install), or grant it "
            f"(kbroker endpoint acls --sends-to)"
        )
        self.queue, self.topic = queue, topic


class QueueNameCollisionError(InvalidArgumentError):
    """A queue name (a transport queue at install, a secondary queue named by its instance)
    would be the topic of another queue, or a topic Kafka refuses beside it (core/names.py)."""

    def __init__(self, name: str, other: str, reason: str):
        super().__init__(f"{name} collides with {other}: {reason}")
        self.name, self.other, self.reason = name, other, reason


# --- catalog ------------------------------------------------------------------------------


class DefinitionError(KBrokerError):
    """A catalog definition is invalid. Names the file, the object and the reason."""

    def __init__(self, file: str | None, obj: str | None, reason: str):
        self.file, self.obj, self.reason = file, obj, reason
        where = ": ".join(p for p in (file, obj) if p)
        super().__init__(f"{where}: {reason}" if where else reason)


class TopicCollisionError(DefinitionError):
    """A topic apply would create collides in Kafka with another topic ('.' and '_' are one
    character in Kafka's comparison), of this namespace or another one: names both."""

    def __init__(self, file: str | None, obj: str | None, topic: str, other: str, why: str = ""):
        self.topic, self.other = topic, other
        super().__init__(
            file,
            obj,
            f"topic {topic} collides with topic {other}: Kafka treats '.' and '_' "
            f"in topic names as one character{'; ' + why if why else ''}",
        )


class CatalogError(KBrokerError):
    """A catalog object the call needs does not exist."""


class UnknownServiceError(CatalogError):
    """No service of that name in the catalog."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown service {name!r}")


class UnknownContractError(CatalogError):
    """No contract of that name, or the target service does not accept it."""

    def __init__(self, name: str, service: str | None = None):
        self.name, self.service = name, service
        extra = f" on service {service!r}" if service else ""
        super().__init__(f"unknown contract {name!r}{extra}")


class UnknownMessageTypeError(CatalogError):
    """No message type of that name in the catalog."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown message type {name!r}")


class UnknownQueueError(CatalogError):
    """No queue of that name in the catalog."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown queue {name!r}")


# --- messaging ----------------------------------------------------------------------------


class ContractViolationError(KBrokerError):
    """The message type may not be sent by this side of the conversation under its contract."""

    def __init__(self, message_type: str, contract: str, side: str):
        self.message_type, self.contract, self.side = message_type, contract, side
        super().__init__(f"message type {message_type!r} may not be sent by the {side} of contract {contract!r}")


class MessageValidationError(KBrokerError):
    """The body fails the validation its message type declares."""

    def __init__(self, message_type: str, validation: str, reason: str):
        self.message_type, self.validation, self.reason = message_type, validation, reason
        self.number = -9615 if validation == "VALID_XML" else None  # Service Broker's, for a schema's
        number = f"error {self.number}: " if self.number else ""
        super().__init__(f"body of {message_type!r} fails {validation} validation: {number}{reason}")


class MessageTooLargeError(KBrokerError):
    """The body is larger than the receiving queue's message size limit."""

    def __init__(self, size: int, limit: int, queue: str):
        self.size, self.limit, self.queue = size, limit, queue
        super().__init__(f"message of {size} bytes exceeds the {limit}-byte limit of queue {queue!r}")


class ConversationNotFoundError(KBrokerError):
    """No endpoint with that conversation handle (never existed, or removed WITH CLEANUP)."""

    def __init__(self, handle: str):
        self.handle = handle
        super().__init__(f"conversation handle {handle} does not exist")


class ConversationGroupError(KBrokerError):
    """A conversation may only join a group of its own queue (RELATED_CONVERSATION, MOVE)."""

    def __init__(self, group: str, queue: str, other_queue: str):
        self.group, self.queue, self.other_queue = group, queue, other_queue
        super().__init__(
            f"conversation group {group} belongs to queue {other_queue!r}, not {queue!r}: groups are local to one queue"
        )


class ConversationClosedError(KBrokerError):
    """This side of the conversation ended, or its lifetime expired: nothing more may be sent."""

    def __init__(self, handle: str, state: str):
        self.handle, self.state = handle, state
        super().__init__(f"conversation {handle} is closed for sending (state {state})")


class ConversationLockTimeoutError(KBrokerError):
    """Another transaction has sent on the conversation and has not ended within the lock
    time-out (SEND locks each conversation until its transaction ends)."""

    retriable = True

    def __init__(self, handle: str, timeout: float):
        self.handle, self.timeout = handle, timeout
        super().__init__(f"conversation {handle} is locked by another open transaction (waited {timeout:g} s)")


class QueueDisabledError(KBrokerError):
    """RECEIVE on a queue whose STATUS is OFF (by ALTER QUEUE or poison-message handling)."""

    def __init__(self, queue: str):
        self.queue = queue
        super().__init__(f"queue {queue!r} is disabled (STATUS = OFF)")


class TransactionAbortedError(KBrokerError):
    """The transaction did not commit: nothing it sent is visible and its messages will be
    received again. Retry the unit of work."""

    retriable = True


class RebalanceAbortedError(TransactionAbortedError):
    """The transaction did not commit because the queue's consumer group rebalanced while it was
    open (another reader joined or left): Kafka fences offsets sent with the group's previous
    generation, or the partition moved. Its messages are on the queue again; retrying at once
    normally succeeds (RECEIVE outside a transaction retries by itself)."""


class RecordRefusedError(TransactionAbortedError):
    """Kafka refused a record of the transaction for itself (too large for its topic): nothing
    the transaction did is visible, and the same records would be refused again. The other
    transactions committed with it in one Kafka transaction are not affected."""

    retriable = False

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"Kafka refused a record of the transaction: {reason}")


class TransactionInDoubtError(KBrokerError):
    """The Kafka transaction's commit was requested but its outcome could not be learnt (the
    broker stayed unreachable, or it carried no received messages whose offsets would tell).
    It may have committed: check before doing the work again."""


class TransactionStateError(KBrokerError):
    """The transaction was already committed or rolled back."""


class SavepointNotFoundError(KBrokerError):
    """ROLLBACK TRANSACTION to a savepoint the transaction does not have (SQL Server's 6401)."""

    code = 6401

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"cannot roll back {name}: no transaction or savepoint of that name was found (6401)")


class SendFailedError(KBrokerError):
    """Kafka did not acknowledge a SEND. Nothing was acknowledged to the caller."""

    retriable = True
