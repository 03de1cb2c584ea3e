"""kbroker: SQL Server Service Broker semantics on Apache Kafka.

    import kbroker
    broker = kbroker.connect()
"""

from .client import Broker, connect
from .envelope import Message
from .errors import *  # noqa: F401,F403  (the typed errors are part of the public API)
from .errors import KBrokerError

__version__ = "0.1.0"
__all__ = ["Broker", "connect", "Message", "KBrokerError"]
