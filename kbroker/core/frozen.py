"""Frozen records made on a hot path without their dataclass __init__.

A frozen dataclass's __init__ sets each field through object.__setattr__: for the records made
once per message (a received Envelope and Message, a transport envelope) and once per SEND (the
endpoint's transition) that was a large share of kbroker's own Python per message. For a class
with no __post_init__, no slots and nothing but its fields in its __dict__, the object holding
exactly those fields is the one __init__ makes; tests compare the two for each class built here
(tests/unit/test_envelope.py, test_transport_message.py, test_sequence_blocks.py).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def built(cls: type[T], fields: dict[str, Any], /, **changes: Any) -> T:
    """cls(**fields, **changes), every field given (a dict literal costs less than the same
    keyword arguments); `changes` override `fields`, as dataclasses.replace's do."""
    new = object.__new__(cls)
    new.__dict__.update(fields, **changes)
    return new
