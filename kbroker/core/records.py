"""What a statement produces: records, before any Kafka client sees them."""

from __future__ import annotations

from typing import Any

Header = tuple[str, bytes]
Record = tuple[str, Any, bytes | None, list[Header] | None]  # topic, key, value, headers
