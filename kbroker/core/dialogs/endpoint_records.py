"""The endpoints topic's records decoded, or rejected (core/rejected.py): what the endpoint
cache reads and the 5th-tick scan checks. Keys: "<handle>" (the endpoint), "<handle>/groups"
(its group chain), "<handle>/lease" and "<handle>/want" (the send lease and who waits for it)."""

from __future__ import annotations

from typing import Any, Literal

import orjson

from kbroker.core.dialogs.conversation_endpoint import CHAIN_SUFFIX, MAX_LIFETIME, Endpoint
from kbroker.core.dialogs.send_lease import LEASE_SUFFIX, WANT_SUFFIX, SendLease, Want
from kbroker.core.rejected import Rejected, json_object, text_key, typed

Kind = Literal["endpoint", "chain", "lease", "want"]


def endpoint_record(key: bytes | None, value: bytes | None) -> tuple[Kind, str, Any]:
    """(kind, handle, decoded value or None for a tombstone), else Rejected."""
    # A tombstone deletes what its key held, if anything (the 5th-tick scan's, over a bad record).
    text = key.decode(errors="replace") if value is None and key is not None else text_key(key)
    for suffix, kind in ((CHAIN_SUFFIX, "chain"), (LEASE_SUFFIX, "lease"), (WANT_SUFFIX, "want")):
        if text.endswith(suffix):
            handle = text[: -len(suffix)]
            return kind, handle, None if value is None else _decoders[kind](value)  # type: ignore[return-value]
    return "endpoint", text, None if value is None else endpoint(value)


def endpoint(value: bytes) -> Endpoint:
    d = json_object(value)
    if isinstance(d.get("lifetime"), (int, float)) and d["lifetime"] >= MAX_LIFETIME:
        d["lifetime"] = None  # written before "never" was None: Service Broker's 2038 default
    if d.get("group_chain") is None:
        d.pop("group_chain", None)
    return typed(Endpoint, d)


def chain(value: bytes) -> tuple[str, ...]:
    try:
        groups = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise Rejected(f"not JSON ({exc})") from None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise Rejected("a group chain is a list of group ids")
    return tuple(groups)


def lease(value: bytes) -> SendLease:
    d = json_object(value)
    if d.get("fence") is None:
        d.pop("fence", None)
    return typed(SendLease, d)


def want(value: bytes) -> Want:
    return typed(Want, json_object(value))


_decoders = {"chain": chain, "lease": lease, "want": want}
