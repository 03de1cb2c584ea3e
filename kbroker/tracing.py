"""OpenTelemetry traces of a message's path: SEND, the queue, RECEIVE, the reply, a routed hop.

The W3C trace context travels in the message's own headers, `traceparent` and `tracestate`: the
names NServiceBus and every OpenTelemetry messaging instrumentation use, so an estate that mixes
them joins up. A SEND writes the context of its span; a RECEIVE's span is the child of its first
message's (the others are linked), and the SENDs and COMMIT of the same transaction are children
of that RECEIVE: a handler's reply continues the request's trace without the handler doing
anything. A routed message keeps its headers through the transmitter, the link and the far
dispatcher (they are signed with it), so the trace crosses namespaces and clusters.

Optional: with `opentelemetry-api` installed (`pip install kbroker[tracing]`) and a tracer
provider set up by the application, spans are recorded; without either every function here does
nothing and costs a check. The API alone (another library may bring it) records nothing, but its
no-op spans, context attaches and header parsing still cost about 0.3 ms of CPU a message under
load (the transport's receive at half its rate: docs/benchmarks.md, thirteenth round), so kbroker
makes no spans until a provider is set. Span attributes name the namespace, queue and
conversation, as OpenTelemetry's messaging conventions do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: tracing is off
    otel_trace = None  # type: ignore[assignment]

HEADERS = ("traceparent", "tracestate")
SYSTEM = "kbroker"
Headers = Sequence[tuple[str, Any]]
_provider: Any = None  # None: OpenTelemetry's global tracer provider
_UNKNOWN = object()
_PROVIDER_SETTING = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def enabled() -> bool:
    """Whether spans are recorded: opentelemetry-api is installed and a tracer provider is set
    (use_tracer_provider, or OpenTelemetry's global one: set_tracer_provider or the
    OTEL_PYTHON_TRACER_PROVIDER setting, read when this module is imported). Asked per statement,
    so a provider set later in code counts."""
    if otel_trace is None:
        return False
    if _provider is not None:
        return True
    # The API's get_tracer_provider() looks the setting up in os.environ each time it finds no
    # provider (about 1 µs, several times a message); its global, when there, answers at once.
    if getattr(otel_trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_SETTING:
        return False
    return not isinstance(otel_trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))


def use_tracer_provider(provider: Any) -> None:
    """Record kbroker's spans with `provider` rather than the global one (None: the global one
    again): for an application that keeps its providers apart, and for tests."""
    global _provider
    _provider = provider


def _tracer() -> Any:
    return otel_trace.get_tracer("kbroker", tracer_provider=_provider)


def context_of(headers: Headers | None) -> Any:
    """The trace context a message's headers carry (None when they carry none, or tracing is off)."""
    if not headers or not enabled():
        return None
    carrier = {
        name: (value.decode("latin-1") if isinstance(value, bytes) else str(value))
        for name, value in headers
        if name in HEADERS and value is not None
    }
    if "traceparent" not in carrier:
        return None
    ctx = TraceContextTextMapPropagator().extract(carrier)
    return ctx if otel_trace.get_current_span(ctx).get_span_context().is_valid else None


def _parent(fallback: Any) -> Any:
    """The context a new span is the child of: the current one when a span is active there (the
    application's own, or a handler's), else `fallback` (the transaction's last RECEIVE)."""
    if otel_trace.get_current_span().get_span_context().is_valid:
        return None
    return fallback


def _attributes(namespace: str, queue: str | None, conversation_id: str | None, operation: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "kbroker.namespace": namespace,
    }
    if queue:
        attrs["messaging.destination.name"] = queue
    if conversation_id:
        attrs["messaging.message.conversation_id"] = conversation_id
    return attrs


def send_headers(
    namespace: str, queue: str | None, conversation_id: str | None, message_type: str | None, parent: Any = None
) -> list[tuple[str, bytes]]:
    """A SEND's span (the child of the current span, else of `parent`), ended at once, and the
    headers that carry its context to the receiver; [] when tracing is off."""
    if not enabled():
        return []
    span = _tracer().start_span(
        f"{queue or 'route'} send",
        context=_parent(parent),
        kind=otel_trace.SpanKind.PRODUCER,
        attributes={
            **_attributes(namespace, queue, conversation_id, "send"),
            **({"kbroker.message_type": message_type} if message_type else {}),
        },
    )
    try:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=otel_trace.set_span_in_context(span))
        return [(name, carrier[name].encode()) for name in HEADERS if name in carrier]
    finally:
        span.end()


def with_trace_headers(
    headers: Mapping[str, str] | None, namespace: str, destination: str, parent: Any = None
) -> Mapping[str, str] | None:
    """A transport message's headers with its SEND's trace context added (the transport face keeps
    headers as text, as NServiceBus does); a `traceparent` the caller set stands, and without
    tracing the headers are returned as they are."""
    if "traceparent" in (headers or {}) or not enabled():
        return headers
    extra = send_headers(namespace, destination, None, None, parent)
    return {**(headers or {}), **{name: value.decode() for name, value in extra}} if extra else headers


def receive_span(namespace: str, queue: str, contexts: list[Any], conversation_id: str | None) -> Any:
    """A RECEIVE's span, ended at once: the child of its first message's context (the others
    linked), else of the current context. Returns the context its transaction's later spans are
    children of (None when tracing is off)."""
    if not enabled():
        return None
    parent = next((c for c in contexts if c is not None), None)
    links = [
        otel_trace.Link(otel_trace.get_current_span(c).get_span_context())
        for c in contexts
        if c is not None and c is not parent
    ]
    span = _tracer().start_span(
        f"{queue} receive",
        context=parent,
        kind=otel_trace.SpanKind.CONSUMER,
        links=links,
        attributes=_attributes(namespace, queue, conversation_id, "receive"),
    )
    span.end()
    return otel_trace.set_span_in_context(span, parent)


@contextmanager
def traced(name: str, parent: Any, namespace: str, **attributes: Any) -> Iterator[Any]:
    """A span around a block (a COMMIT, a handler), the child of the current span, else of
    `parent`, made current inside it so what the block sends continues the trace; records an
    exception that leaves the block."""
    if not enabled():
        yield None
        return
    attrs = {
        "messaging.system": SYSTEM,
        "kbroker.namespace": namespace,
        **{k: v for k, v in attributes.items() if v is not None},
    }
    with _tracer().start_as_current_span(name, context=_parent(parent), attributes=attrs):
        yield otel_context.get_current()


def handling(queue: str, parent: Any, namespace: str) -> Any:
    """The span around a transport handler (`<queue> process`), the child of the RECEIVE's
    context `parent`: what the handler sends continues it."""
    return traced(
        f"{queue} process",
        parent,
        namespace,
        **{"messaging.operation.type": "process", "messaging.destination.name": queue},
    )
