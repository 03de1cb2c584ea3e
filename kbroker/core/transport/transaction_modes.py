"""The transport's transaction modes (NServiceBus's TransportTransactionMode): how a handler's
sends and its message's removal go together. Pure."""

from __future__ import annotations

import enum


class TransactionMode(enum.StrEnum):
    """SendsAtomicWithReceive: the sends and the removal commit in one Kafka transaction (the
    default). ReceiveOnly: the removal is transactional (a failure puts the message back), the
    sends are dispatched just before it, on their own, so a failed removal sends them again.
    None: the message is removed before its handler runs (at most once: a failure loses it) and
    the sends are dispatched when the handler returns."""

    SENDS_ATOMIC_WITH_RECEIVE = "SendsAtomicWithReceive"
    RECEIVE_ONLY = "ReceiveOnly"
    NONE = "None"

    @classmethod
    def of(cls, value: TransactionMode | str) -> TransactionMode:
        """From the enum or its name (case and '_' ignored); ValueError naming the choices."""
        if isinstance(value, TransactionMode):
            return value
        text = str(value).replace("_", "").lower()
        for mode in cls:
            if mode.value.lower() == text:
                return mode
        raise ValueError(f"transaction mode {value!r} is not one of {', '.join(m.value for m in cls)}")
