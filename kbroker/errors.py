"""Typed errors. Every error names what is wrong; `retriable` says whether the same call may
succeed later without the caller changing anything (a broker that is still starting, a lost
connection), as opposed to input that will be refused every time."""

from __future__ import annotations


class KBrokerError(Exception):
    """Base of every kbroker error."""

    retriable = False


# --- infrastructure -----------------------------------------------------------------------


class BrokerUnavailableError(KBrokerError):
    """No Kafka broker answered at the bootstrap address."""

    retriable = True


class EmbeddedBrokerError(KBrokerError):
    """The embedded Apache Kafka broker could not be fetched, started or stopped."""


class JavaMissingError(EmbeddedBrokerError):
    pass


class MavenMissingError(EmbeddedBrokerError):
    pass


class RepositoryUnreachableError(EmbeddedBrokerError):
    retriable = True


class PortInUseError(EmbeddedBrokerError):
    pass


# --- catalog ------------------------------------------------------------------------------


class DefinitionError(KBrokerError):
    """A catalog definition is invalid. Names the file, the object and the reason."""

    def __init__(self, file: str | None, obj: str | None, reason: str):
        self.file, self.obj, self.reason = file, obj, reason
        where = ": ".join(p for p in (file, obj) if p)
        super().__init__(f"{where}: {reason}" if where else reason)


class CatalogError(KBrokerError):
    """A catalog object the call needs does not exist."""


class UnknownServiceError(CatalogError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown service {name!r}")


class UnknownContractError(CatalogError):
    def __init__(self, name: str, service: str | None = None):
        self.name, self.service = name, service
        extra = f" on service {service!r}" if service else ""
        super().__init__(f"unknown contract {name!r}{extra}")


class UnknownMessageTypeError(CatalogError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown message type {name!r}")


class UnknownQueueError(CatalogError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown queue {name!r}")


# --- messaging ----------------------------------------------------------------------------


class ContractViolationError(KBrokerError):
    """The message type may not be sent by this side of the conversation under its contract."""

    def __init__(self, message_type: str, contract: str, side: str):
        self.message_type, self.contract, self.side = message_type, contract, side
        super().__init__(
            f"message type {message_type!r} may not be sent by the {side} of contract {contract!r}"
        )


class MessageValidationError(KBrokerError):
    """The body fails the validation its message type declares."""

    def __init__(self, message_type: str, validation: str, reason: str):
        self.message_type, self.validation, self.reason = message_type, validation, reason
        super().__init__(f"body of {message_type!r} fails {validation} validation: {reason}")


class MessageTooLargeError(KBrokerError):
    def __init__(self, size: int, limit: int, queue: str):
        self.size, self.limit, self.queue = size, limit, queue
        super().__init__(f"message of {size} bytes exceeds the {limit}-byte limit of queue {queue!r}")


class ConversationNotFoundError(KBrokerError):
    def __init__(self, handle: str):
        self.handle = handle
        super().__init__(f"conversation handle {handle} does not exist")


class ConversationGroupError(KBrokerError):
    """A conversation may only join a group of its own queue (RELATED_CONVERSATION, MOVE)."""

    def __init__(self, group: str, queue: str, other_queue: str):
        self.group, self.queue, self.other_queue = group, queue, other_queue
        super().__init__(f"conversation group {group} belongs to queue {other_queue!r}, "
                         f"not {queue!r}: groups are local to one queue")


class ConversationClosedError(KBrokerError):
    def __init__(self, handle: str, state: str):
        self.handle, self.state = handle, state
        super().__init__(f"conversation {handle} is closed for sending (state {state})")


class ConversationLockTimeoutError(KBrokerError):
    """Another transaction has sent on the conversation and has not ended within the lock
    time-out (SEND locks each conversation until its transaction ends)."""

    retriable = True

    def __init__(self, handle: str, timeout: float):
        self.handle, self.timeout = handle, timeout
        super().__init__(f"conversation {handle} is locked by another open transaction "
                         f"(waited {timeout:g} s)")


class QueueDisabledError(KBrokerError):
    def __init__(self, queue: str):
        self.queue = queue
        super().__init__(f"queue {queue!r} is disabled (STATUS = OFF)")


class TransactionAbortedError(KBrokerError):
    """The transaction did not commit: nothing it sent is visible and its messages will be
    received again. Retry the unit of work."""

    retriable = True


class TransactionStateError(KBrokerError):
    """The transaction was already committed or rolled back."""


class SendFailedError(KBrokerError):
    """Kafka did not acknowledge a SEND. Nothing was acknowledged to the caller."""

    retriable = True
