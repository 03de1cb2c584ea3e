"""kbroker: SQL Server Service Broker semantics on Apache Kafka.

    import kbroker
    broker = kbroker.connect()

The facade is lazy: `import kbroker` loads nothing but this file and the errors, so pure modules
(kbroker.core) and the CLI start fast; the SDK and its Kafka client load on first use of a name
below.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from kbroker.errors import *  # noqa: F403  (the typed errors are part of the public API)
from kbroker.errors import KBrokerError

if TYPE_CHECKING:
    from kbroker.core.catalog.models import DIALOG_TIMER, END_DIALOG
    from kbroker.core.catalog.models import ERROR as ERROR_TYPE
    from kbroker.core.dialogs.envelope import Message
    from kbroker.sdk.broker import Broker, connect
    from kbroker.sdk.pollers import PollerPool, ReaderPool
    from kbroker.sdk.transaction import Transaction

__version__ = "0.1.0"

_LAZY = {
    "Broker": ("kbroker.sdk.broker", "Broker"),
    "connect": ("kbroker.sdk.broker", "connect"),
    "Transaction": ("kbroker.sdk.transaction", "Transaction"),
    "PollerPool": ("kbroker.sdk.pollers", "PollerPool"),
    "ReaderPool": ("kbroker.sdk.pollers", "ReaderPool"),
    "Message": ("kbroker.core.dialogs.envelope", "Message"),
    "END_DIALOG": ("kbroker.core.catalog.models", "END_DIALOG"),
    "ERROR_TYPE": ("kbroker.core.catalog.models", "ERROR"),
    "DIALOG_TIMER": ("kbroker.core.catalog.models", "DIALOG_TIMER"),
}
__all__ = [
    "Broker",
    "connect",
    "Transaction",
    "PollerPool",
    "ReaderPool",
    "Message",
    "KBrokerError",
    "END_DIALOG",
    "ERROR_TYPE",
    "DIALOG_TIMER",
]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kbroker' has no attribute {name!r}") from None
    value = getattr(import_module(module), attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
