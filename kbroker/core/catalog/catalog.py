"""The Catalog: every object of one namespace, keyed by name, with the built-ins always present,
and the look-ups the statements make. Read back from Kafka it is trusted as published: references
between its objects are checked by the loader."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import Field, model_validator

from kbroker.core import names
from kbroker.core.catalog.bindings import RemoteServiceBinding, binding_for
from kbroker.core.catalog.built_ins import BUILTIN_CONTRACTS, BUILTIN_MESSAGE_TYPES
from kbroker.core.catalog.objects import (
    BrokerEndpoint,
    Contract,
    MessageType,
    Queue,
    Route,
    Service,
    SystemTopic,
    XmlSchemaCollection,
)
from kbroker.core.catalog.priorities import BrokerPriority, DatabaseOption, conversation_priority, honors_priority
from kbroker.core.catalog.values import StrictModel
from kbroker.errors import (
    CatalogError,
    UnknownContractError,
    UnknownMessageTypeError,
    UnknownQueueError,
    UnknownServiceError,
)


class Catalog(StrictModel):
    """Every object of one namespace, keyed by name. The built-ins are always present."""

    namespace: str
    message_types: dict[str, MessageType] = {}
    contracts: dict[str, Contract] = {}
    queues: dict[str, Queue] = {}
    services: dict[str, Service] = {}
    routes: dict[str, Route] = {}
    broker_endpoints: dict[str, BrokerEndpoint] = {}
    xml_schema_collections: dict[str, XmlSchemaCollection] = {}
    broker_priorities: dict[str, BrokerPriority] = {}
    database_options: dict[str, DatabaseOption] = {}
    remote_service_bindings: dict[str, RemoteServiceBinding] = {}
    # Filled by the loader only, never published: system topic overrides of the applied files,
    # and where each object was defined ("queue X" -> file) for error messages.
    system_topics: dict[str, SystemTopic] = Field(default={}, exclude=True)
    origins: dict[str, str] = Field(default={}, exclude=True)
    drops: list[tuple[str, str]] = Field(default=[], exclude=True)  # the files' drop: list (kind, name)

    @model_validator(mode="after")
    def _remember_keys(self) -> "Catalog":
        # Every process that reads the catalog names its queues' topics by it (names.queue_topic).
        names.remember_keys(self.namespace, {q.name: q.topic_key for q in self.queues.values() if q.topic_key})
        return self

    @model_validator(mode="before")
    @classmethod
    def _builtins(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            data["message_types"] = {**BUILTIN_MESSAGE_TYPES, **(data.get("message_types") or {})}
            data["contracts"] = {**BUILTIN_CONTRACTS, **(data.get("contracts") or {})}
        return data

    @model_validator(mode="after")
    def _keys_are_names(self) -> "Catalog":
        for kind in (
            "message_types",
            "contracts",
            "queues",
            "services",
            "routes",
            "broker_endpoints",
            "xml_schema_collections",
            "broker_priorities",
            "database_options",
            "remote_service_bindings",
        ):
            for key, obj in getattr(self, kind).items():
                if key != obj.name:
                    raise ValueError(f"{kind} key {key!r} differs from the object's name {obj.name!r}")
        return self

    # lookups ------------------------------------------------------------------------------

    @property
    def forwarding(self) -> BrokerEndpoint | None:
        """The broker endpoint when it has MESSAGE_FORWARDING = ENABLED, else None."""
        return next((e for e in self.broker_endpoints.values() if e.message_forwarding == "ENABLED"), None)

    def service(self, name: str) -> Service:
        try:
            return self.services[name]
        except KeyError:
            raise UnknownServiceError(name) from None

    def contract(self, name: str) -> Contract:
        try:
            return self.contracts[name]
        except KeyError:
            raise UnknownContractError(name) from None

    def message_type(self, name: str) -> MessageType:
        try:
            return self.message_types[name]
        except KeyError:
            raise UnknownMessageTypeError(name) from None

    def schema_collection_of(self, mt: MessageType) -> XmlSchemaCollection | None:
        """The XML schema collection a VALID_XML message type names (None for another validation);
        CatalogError when it is not in the catalog."""
        if mt.schema_collection is None:
            return None
        try:
            return self.xml_schema_collections[mt.schema_collection]
        except KeyError:
            raise CatalogError(f"unknown XML schema collection {mt.schema_collection!r}") from None

    def queue(self, name: str) -> Queue:
        try:
            return self.queues[name]
        except KeyError:
            raise UnknownQueueError(name) from None

    def may_send(self, contract_name: str, message_type_name: str, side: str) -> bool:
        """Whether `side` may SEND this message type on a conversation of this contract.
        Raises UnknownContractError for an unknown contract; an unknown message type is simply
        not in the contract (False). The system types are sent by END CONVERSATION and timers,
        never by SEND, so they are not allowed here unless a contract lists them."""
        if side not in ("INITIATOR", "TARGET"):
            raise ValueError(f"side must be INITIATOR or TARGET, not {side!r}")
        return any(
            m.type == message_type_name and m.sent_by in (side, "ANY") for m in self.contract(contract_name).messages
        )

    def service_accepts(self, service_name: str, contract_name: str) -> bool:
        """Whether a service accepts conversations on this contract as their target."""
        return contract_name in self.service(service_name).contracts

    def endpoint_priority(self, contract: str, local: str, remote: str) -> int | None:
        """The priority a new endpoint of `contract` between its `local` and `remote` services
        gets from the broker priorities (priorities.py); None when none matches."""
        if not self.broker_priorities:
            return None
        return conversation_priority(self.broker_priorities.values(), contract, local, remote)

    @property
    def honor_broker_priority(self) -> bool:
        return honors_priority(self.database_options)

    def binding_for(self, service: str) -> RemoteServiceBinding | None:
        """The remote service binding for the far service `service` (bindings.py), or None."""
        return binding_for(self.remote_service_bindings.values(), service)

    def services_on_queue(self, queue_name: str) -> list[Service]:
        return [s for s in self.services.values() if s.queue == queue_name]

    # serialisation -------------------------------------------------------------------------

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, data: bytes | str) -> "Catalog":
        return cls.model_validate(orjson.loads(data))
