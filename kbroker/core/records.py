"""What a statement produces: records, before any Kafka client sees them."""

from __future__ import annotations

from typing import Any

Record = tuple[str, Any, bytes | None, list | None]  # topic, key, value, headers
