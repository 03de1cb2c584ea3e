"""`kbroker.transport`: the transport face (NServiceBus's SQL Server transport on Kafka).

    from kbroker import transport
    ep = transport.endpoint("Sales", install=True)
    ep.send("Billing", b"...")

The code is kbroker.sdk.transport.endpoint (sync), kbroker.sdk.transport.aio (asyncio) and their
transactions; docs/transport.md describes the model.
"""

from kbroker.core.transport.message import TransportMessage
from kbroker.core.transport.recoverability import ErrorResult, Recoverability
from kbroker.errors import TransportQueueNotFoundError
from kbroker.sdk.transport.aio import AsyncTransportEndpoint, AsyncTransportTransaction
from kbroker.sdk.transport.aio import endpoint as async_endpoint
from kbroker.sdk.transport.endpoint import TransportEndpoint, endpoint
from kbroker.sdk.transport.on_error import ErrorContext
from kbroker.sdk.transport.transaction import TransportTransaction

__all__ = [
    "AsyncTransportEndpoint",
    "AsyncTransportTransaction",
    "ErrorContext",
    "ErrorResult",
    "Recoverability",
    "TransportEndpoint",
    "TransportMessage",
    "TransportQueueNotFoundError",
    "TransportTransaction",
    "async_endpoint",
    "endpoint",
]
