"""The catalog's objects as pydantic models: message types, XML schema collections, contracts,
queues (and their activation), services (and their owners), routes, the broker endpoint and the
system topics. Each is checked on its own here; references between objects are the loader's to
check."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from kbroker.config import NAMESPACE_RE
from kbroker.core.catalog.values import (
    BROKER_CONFIGURATION,
    MAX_SERVICE_NAME,
    PROCEDURE_RE,
    ActivationKind,
    EnabledDisabled,
    OnOff,
    Side,
    StrictModel,
    Validation,
    parse_kafka_address,
)
from kbroker.core.names import QUEUE_NAME_RE, SYSTEM_TOPICS
from kbroker.core.topic_keys import encoded_key, queue_name_problem
from kbroker.core.topic_limits import MAX_QUEUE_MESSAGE_BYTES


class EarlierValidation(StrictModel):
    """A message type's validation before an ALTER MESSAGE TYPE: in force `until` (epoch seconds)."""

    MAX: ClassVar[int] = 4  # kept per message type

    until: float = Field(ge=0)
    validation: Validation = "NONE"
    schema_collection: str | None = Field(default=None, min_length=1, max_length=128)


class MessageType(StrictModel):
    name: str = Field(min_length=1, max_length=256)
    validation: Validation = "NONE"
    # VALID_XML WITH SCHEMA COLLECTION <name>: the xml_schema_collections entry, with VALID_XML only.
    schema_collection: str | None = Field(default=None, min_length=1, max_length=128)
    # The validations this one replaced, newest first (set by `kbroker apply`, at most
    # EarlierValidation.MAX): a message queued before a change is checked on RECEIVE as it was on arrival.
    earlier: list[EarlierValidation] = Field(default=[], max_length=4)

    def validation_at(self, enqueued_ms: int | None) -> tuple[str, str | None]:
        """(validation, schema collection) in force when a message was queued at `enqueued_ms`
        (None: now): ALTER MESSAGE TYPE does not affect messages already in a queue."""
        found = (self.validation, self.schema_collection)
        if enqueued_ms is None:
            return found
        for e in self.earlier:  # newest first: the last one still in force then wins
            if enqueued_ms < e.until * 1000:
                found = (e.validation, e.schema_collection)
        return found

    @model_validator(mode="after")
    def _collection_with_valid_xml(self) -> "MessageType":
        if self.validation == "VALID_XML" and self.schema_collection is None:
            raise ValueError("validation VALID_XML names its schema_collection")
        if self.validation != "VALID_XML" and self.schema_collection is not None:
            raise ValueError(f"schema_collection is for validation VALID_XML, not {self.validation}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Written only when set: a catalog record without it reads back in a kbroker before it.
        data = handler(self)
        if isinstance(data, dict) and data.get("schema_collection") is None:
            data.pop("schema_collection", None)
        if isinstance(data, dict) and not data.get("earlier"):
            data.pop("earlier", None)
        return data


class XmlSchemaCollection(StrictModel):
    """CREATE XML SCHEMA COLLECTION: the text of its schemas (XSD 1.0, each its own target
    namespace or none), published whole so every process validates against the same text; the
    loader reads a definition's `files:` into `schemas` (core/catalog/xml_schemas.py compiles)."""

    name: str = Field(min_length=1, max_length=128)
    schemas: list[str] = Field(min_length=1)


class ContractMessage(StrictModel):
    type: str = Field(min_length=1)
    sent_by: Side


class Contract(StrictModel):
    name: str = Field(min_length=1, max_length=256)
    messages: list[ContractMessage] = Field(min_length=1)

    @field_validator("messages")
    @classmethod
    def _initiator_speaks_first(cls, messages: list[ContractMessage]) -> list[ContractMessage]:
        seen: set[str] = set()
        for m in messages:
            if m.type in seen:
                raise ValueError(f"message type {m.type!r} is listed twice")
            seen.add(m.type)
        # Service Broker refuses a contract the initiator cannot open (CREATE CONTRACT rule).
        if not any(m.sent_by in ("INITIATOR", "ANY") for m in messages):
            raise ValueError("at least one message type must be sent by INITIATOR or ANY")
        return messages


class Activation(StrictModel):
    status: OnOff = "ON"
    kind: ActivationKind = "internal"
    procedure: str | None = None  # "package.module:function", called per activated reader
    max_queue_readers: int = Field(default=1, ge=0, le=32767)
    notify_timeout: float = Field(default=60.0, gt=0)  # seconds; external activation only

    @field_validator("procedure")
    @classmethod
    def _procedure_syntax(cls, value: str | None) -> str | None:
        if value is not None and not PROCEDURE_RE.fullmatch(value):
            raise ValueError(f"procedure must be 'module:function', not {value!r}")
        return value

    @model_validator(mode="after")
    def _procedure_required(self) -> "Activation":
        if self.kind == "internal" and self.status == "ON" and self.procedure is None:
            raise ValueError("procedure is required for internal activation with status ON")
        return self


TOPIC_RETENTION = "topic_retention"  # a queue setting no longer: see Queue._forget_topic_retention


class Queue(StrictModel):
    name: str
    partitions: int = Field(default=4, ge=1, le=1000)
    retention: OnOff = "OFF"  # Service Broker RETENTION: keep received messages until the end
    status: OnOff = "ON"
    poison_message_handling: OnOff = "ON"
    max_message_bytes: int = Field(default=1_048_576, ge=1, le=MAX_QUEUE_MESSAGE_BYTES)
    activation: Activation | None = None
    # Seconds after which an unreceived message counts as stale for this queue (the analytics
    # job's per-queue threshold, beside the seeds' 10 s and 60 s); None: the job's default.
    stale_after: float | None = Field(default=None, gt=0, le=7 * 86400)
    # The key in the queue's topic name (core/names.py), set by apply when the queue is first
    # applied and kept after. None only in a definition file (apply sets it) and in a record
    # published before keys existed (read back as the name: published_key).
    topic_key: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,120}$")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = queue_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="before")
    @classmethod
    def _forget_topic_retention(cls, value: Any) -> Any:
        # Catalog records published before queue topics kept every record carry the old
        # `topic_retention` setting: read back, it means nothing now (definition files naming it
        # are refused by the loader, with the reason).
        if isinstance(value, dict) and TOPIC_RETENTION in value:
            return {k: v for k, v in value.items() if k != TOPIC_RETENTION}
        return value


def published_key(queue: Queue) -> Queue:
    """A queue as read back from the catalog topic: a record published before keys existed has
    none, and its topic is named by the queue's name (all such names were valid keys)."""
    if queue.topic_key is not None:
        return queue
    key = queue.name if QUEUE_NAME_RE.match(queue.name) else encoded_key(queue.name)
    return queue.model_copy(update={"topic_key": key})


SECURITY_LEVELS = ("none", "anonymous", "full")  # a routed dialog's security, least first


class Service(StrictModel):
    name: str = Field(min_length=1, max_length=MAX_SERVICE_NAME)
    queue: str
    contracts: list[str] = []  # contracts it accepts as a target; none = initiator only
    # CREATE SERVICE ... AUTHORIZATION: the database principal whose certificate proves the
    # service to a far one (dialog security, bindings.py).
    owner: str = Field(default="dbo", min_length=1, max_length=128)
    # GRANT SEND ON SERVICE to other namespaces: those whose routed messages it takes (their
    # senders proven by signature, core/routing/signing.py); None: every namespace whose public
    # key this namespace holds. A namespace not listed gets Service Broker's Error -8494.
    remote_senders: list[str] | None = None
    # The least dialog security a routed dialog to this service must have (SECURITY_LEVELS): its
    # messages in clear, or without the initiator's signature, get Error -8494. "none" is
    # Service Broker's SEND granted to public (unsecured dialogs are taken).
    remote_security: Literal["none", "anonymous", "full"] = "none"

    @field_validator("contracts")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a contract is listed twice")
        return value

    @field_validator("remote_senders")
    @classmethod
    def _namespaces(cls, value: list[str] | None) -> list[str] | None:
        bad = [n for n in value or [] if not NAMESPACE_RE.match(n)]
        if bad:
            raise ValueError(f"remote_senders lists {bad[0]!r}, which is no namespace name")
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Written only when not dbo: a published service reads the same, and reads back in a
        # kbroker before owners.
        data = handler(self)
        if isinstance(data, dict) and data.get("owner") == "dbo":
            data.pop("owner", None)
        if isinstance(data, dict) and data.get("remote_security") == "none":
            data.pop("remote_security", None)
        return data


class Route(StrictModel):
    """CREATE ROUTE: where messages to a service go (see kbroker/core/routing/routes.py for matching).

    `address` is LOCAL (this namespace), TRANSPORT (the service name is the address) or
    `kafka://host:port[,host:port]/<namespace>`, the Kafka cluster and namespace of the next hop.
    A namespace's broker instance id is its name, so `kafka://host:port` without a namespace is
    accepted when `broker_instance` names it. `created_at` is stamped by `kbroker apply`."""

    name: str = Field(min_length=1, max_length=256)
    service_name: str | None = Field(default=None, min_length=1, max_length=MAX_SERVICE_NAME)  # None: every service
    address: str  # LOCAL | TRANSPORT | kafka://host:port[,host:port][/namespace]
    broker_instance: str | None = None  # None: any instance (a namespace name)
    lifetime: int | None = Field(default=None, gt=0)  # seconds; None = never expires
    mirror_address: str | None = None  # kafka://... of the mirrored (standby) namespace
    # The client settings to reach the address's cluster: the name of a client profile each
    # process resolves locally (kafka/profiles.py), so no credential is in the catalog.
    profile: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    created_at: float | None = Field(default=None, ge=0)  # epoch seconds, set by `kbroker apply`

    @field_validator("address", mode="before")
    @classmethod
    def _address(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() in ("LOCAL", "TRANSPORT"):
            return value.upper()
        if isinstance(value, str) and parse_kafka_address(value) is not None:
            return value
        raise ValueError(f"address must be LOCAL, TRANSPORT or kafka://host:port[,host:port]/namespace, not {value!r}")

    @field_validator("mirror_address")
    @classmethod
    def _mirror(cls, value: str | None) -> str | None:
        if value is not None and parse_kafka_address(value) is None:
            raise ValueError(f"mirror_address must be kafka://host:port[,host:port]/namespace, not {value!r}")
        return value

    @field_validator("broker_instance")
    @classmethod
    def _instance(cls, value: str | None) -> str | None:
        # A broker instance is a namespace name: any other string could never match a dialog.
        if value is not None and not NAMESPACE_RE.fullmatch(value):
            raise ValueError(
                "broker_instance must be a namespace name: 1-40 characters of letters, "
                f"digits, '_' or '-', not {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Route":
        local_or_transport = self.address in ("LOCAL", "TRANSPORT")
        # A TRANSPORT route takes its address from the service name, so it cannot name one.
        if self.address == "TRANSPORT" and (self.service_name is not None or self.broker_instance is not None):
            raise ValueError("a TRANSPORT route cannot name a service_name or broker_instance")
        if not local_or_transport and self.namespace is None:
            raise ValueError(f"address {self.address!r} names no namespace: add /<namespace> or a broker_instance")
        if self.profile is not None and local_or_transport:
            raise ValueError(f"a {self.address} route names no cluster, so it cannot name a profile")
        if self.mirror_address is not None:
            if local_or_transport:
                raise ValueError(f"mirror_address cannot be combined with address {self.address}")
            if self.service_name is None or self.broker_instance is None:
                raise ValueError("mirror_address requires both service_name and broker_instance")
        if self.service_name == BROKER_CONFIGURATION and self.broker_instance is not None:
            raise ValueError(f"a route to {BROKER_CONFIGURATION} cannot name a broker_instance")
        return self

    @property
    def bootstrap(self) -> str | None:
        """The `host:port[,host:port]` of a Kafka address; None for LOCAL and TRANSPORT."""
        parsed = parse_kafka_address(self.address)
        return parsed[0] if parsed else None

    @property
    def namespace(self) -> str | None:
        """The namespace a Kafka address leads to (the broker instance when the address names
        none); None for LOCAL and TRANSPORT."""
        parsed = parse_kafka_address(self.address)
        if parsed is None:
            return None
        return parsed[1] or self.broker_instance


class BrokerEndpoint(StrictModel):
    """CREATE ENDPOINT ... FOR SERVICE_BROKER: the namespace's broker endpoint settings, of which
    kbroker has the forwarding ones (a namespace has at most one endpoint)."""

    name: str = Field(min_length=1, max_length=128)
    message_forwarding: EnabledDisabled = "DISABLED"
    message_forward_size: int = Field(default=10, ge=1, le=2048)  # MB; Microsoft's example uses 10


class SystemTopic(StrictModel):
    """A per-namespace system topic; declared in kbroker/core/catalog/system.yaml."""

    name: Literal[SYSTEM_TOPICS]  # type: ignore[valid-type]
    partitions: int = Field(ge=1, le=1000)
    config: dict[str, str]

    @field_validator("config", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        # Kafka topic configs are strings; YAML gives numbers for retention.ms etc.
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value

    @field_validator("config")
    @classmethod
    def _policy(cls, value: dict[str, str]) -> dict[str, str]:
        if value.get("cleanup.policy") not in ("compact", "delete", "compact,delete"):
            raise ValueError("cleanup.policy must be compact, delete or compact,delete")
        return value
