"""The catalog objects of Service Broker (message types, XML schema collections, contracts, queues,
services, routes) as pydantic models. Unknown fields are errors, so a typo in a definition never
passes silently.
Cross-object references are checked by the loader, not here: a Catalog read back from Kafka is
trusted as published.

The names live in four modules, all importable from here: values.py (value types, address
syntax, name limits), objects.py (the object models), built_ins.py (the system message types and
the DEFAULT contract) and catalog.py (the Catalog of one namespace)."""

from __future__ import annotations

from kbroker.core.catalog.built_ins import (
    BUILTIN_CONTRACTS,
    BUILTIN_MESSAGE_TYPES,
    DEFAULT,
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    SB,
    SYSTEM_TYPES,
)
from kbroker.core.catalog.catalog import Catalog
from kbroker.core.catalog.objects import (
    TOPIC_RETENTION,
    Activation,
    BrokerEndpoint,
    Contract,
    ContractMessage,
    MessageType,
    Queue,
    Route,
    Service,
    SystemTopic,
    XmlSchemaCollection,
)
from kbroker.core.catalog.values import (
    BROKER_CONFIGURATION,
    MAX_SERVICE_NAME,
    OnOff,
    Side,
    Validation,
    parse_kafka_address,
)
from kbroker.core.topic_limits import MAX_QUEUE_MESSAGE_BYTES  # a queue's max_message_bytes is at most this

__all__ = [
    "BROKER_CONFIGURATION",
    "BUILTIN_CONTRACTS",
    "BUILTIN_MESSAGE_TYPES",
    "DEFAULT",
    "DIALOG_TIMER",
    "END_DIALOG",
    "ERROR",
    "MAX_QUEUE_MESSAGE_BYTES",
    "MAX_SERVICE_NAME",
    "SB",
    "SYSTEM_TYPES",
    "TOPIC_RETENTION",
    "Activation",
    "BrokerEndpoint",
    "Catalog",
    "Contract",
    "ContractMessage",
    "MessageType",
    "OnOff",
    "Queue",
    "Route",
    "Service",
    "Side",
    "SystemTopic",
    "Validation",
    "XmlSchemaCollection",
    "parse_kafka_address",
]
