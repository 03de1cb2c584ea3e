"""Auditing (NServiceBus's audit queue): a copy of every message an endpoint's handler
processed, sent to the audit queue in the handler's transaction, with when and where it was
processed beside the message's own headers. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from kbroker.core.transport.recoverability import PROCESSING_ENDPOINT, PROCESSING_MACHINE, nsb_time

AUDIT_QUEUE = "audit"  # NServiceBus's usual name; auditing is off unless an endpoint names one
PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"


def audit_headers(
    headers: Mapping[str, str], *, endpoint: str, machine: str, started: datetime, ended: datetime
) -> dict[str, str]:
    """The headers of a processed message's audit copy."""
    return {
        **headers,
        PROCESSING_STARTED: nsb_time(started),
        PROCESSING_ENDED: nsb_time(ended),
        PROCESSING_ENDPOINT: endpoint,
        PROCESSING_MACHINE: machine,
    }
