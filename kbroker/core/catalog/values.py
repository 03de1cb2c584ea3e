"""The catalog's value types: the ON/OFF and upper/lower-case fields as Service Broker writes them,
the kafka:// address of a route, the name limits, and the strict base of every catalog model."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from kbroker.config import NAMESPACE_RE


def _on_off(value: Any) -> Any:
    # YAML 1.1 reads ON/OFF (and yes/no) as booleans; Service Broker says ON/OFF.
    if value is True:
        return "ON"
    if value is False:
        return "OFF"
    return value.upper() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _enabled(value: Any) -> Any:
    # ENABLED/DISABLED as Service Broker writes them; ON/OFF and YAML booleans mean the same.
    v = _on_off(value)
    return {"ON": "ENABLED", "OFF": "DISABLED"}.get(v, v) if isinstance(v, str) else v


OnOff = Annotated[Literal["ON", "OFF"], BeforeValidator(_on_off)]
Side = Annotated[Literal["INITIATOR", "TARGET", "ANY"], BeforeValidator(_upper)]
Validation = Annotated[Literal["NONE", "EMPTY", "JSON", "WELL_FORMED_XML", "VALID_XML"], BeforeValidator(_upper)]
ActivationKind = Annotated[Literal["internal", "external"], BeforeValidator(_lower)]
EnabledDisabled = Annotated[Literal["ENABLED", "DISABLED"], BeforeValidator(_enabled)]

PROCEDURE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)
# kafka://host:port[,host:port][/namespace]: the hosts, then the namespace of kbroker.config.
_NAMESPACE = NAMESPACE_RE.pattern.strip("^$")
_KAFKA_ADDRESS_RE = re.compile(
    rf"kafka://([^\s,/:]+:[0-9]{{1,5}}(?:,[^\s,/:]+:[0-9]{{1,5}})*)(?:/({_NAMESPACE}))?", re.ASCII
)
# docs/sources.md, item 44: the Broker Configuration Notice service's route names no broker instance.
BROKER_CONFIGURATION = "SQL/ServiceBroker/BrokerConfiguration"
MAX_SERVICE_NAME = 256  # characters in a service name (Service Broker's nvarchar(256))


def parse_kafka_address(value: str) -> tuple[str, str | None] | None:
    """(bootstrap, namespace or None) of `kafka://host:port[,host:port][/namespace]`; None when
    `value` is not such an address (or a port is out of range)."""
    m = _KAFKA_ADDRESS_RE.fullmatch(value)
    if m is None or not all(0 < int(hp.rsplit(":", 1)[1]) < 65536 for hp in m[1].split(",")):
        return None
    return m[1], m[2]


class StrictModel(BaseModel):
    """A catalog model: unknown fields are errors, and a read object never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
