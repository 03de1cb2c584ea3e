"""The objects every catalog has: the system message types the broker sends (EndDialog, Error,
DialogTimer) and the DEFAULT message type and contract."""

from __future__ import annotations

from kbroker.core.catalog.objects import Contract, ContractMessage, MessageType

SB = "http://schemas.microsoft.com/SQL/ServiceBroker/"
END_DIALOG = SB + "EndDialog"
ERROR = SB + "Error"
DIALOG_TIMER = SB + "DialogTimer"
SYSTEM_TYPES = frozenset({END_DIALOG, ERROR, DIALOG_TIMER})  # sent by the broker only, never by SEND
DEFAULT = "DEFAULT"

BUILTIN_MESSAGE_TYPES = {
    DEFAULT: MessageType(name=DEFAULT, validation="NONE"),
    END_DIALOG: MessageType(name=END_DIALOG, validation="EMPTY"),
    ERROR: MessageType(name=ERROR, validation="WELL_FORMED_XML"),
    DIALOG_TIMER: MessageType(name=DIALOG_TIMER, validation="EMPTY"),
}
BUILTIN_CONTRACTS = {
    DEFAULT: Contract(name=DEFAULT, messages=[ContractMessage(type=DEFAULT, sent_by="ANY")]),
}
