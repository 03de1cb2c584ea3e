"""The trace context in a message's headers (kbroker/tracing.py): what another client wrote there
is untrusted, so anything at all gives a context or None, never an error; a context kbroker wrote
comes back as the same trace."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from kbroker import tracing


@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=100)))
def test_any_traceparent_header_gives_a_context_or_none(traceparent, tracestate):
    headers = [("traceparent", traceparent)] + ([("tracestate", tracestate)] if tracestate is not None else [])
    ctx = tracing.context_of(headers)
    assert ctx is None or trace.get_current_span(ctx).get_span_context().is_valid


def test_no_trace_header_no_context():
    assert tracing.context_of(None) is None
    assert tracing.context_of([("kb.message_id", b"x")]) is None
    assert tracing.context_of([("traceparent", b"00-00000000000000000000000000000000-0000000000000000-01")]) is None


def test_what_a_send_writes_a_receive_reads_as_the_same_trace():
    provider = TracerProvider()
    tracing.use_tracer_provider(provider)
    try:
        with provider.get_tracer("t").start_as_current_span("caller") as caller:
            headers = tracing.send_headers("ns", "Q", "conv-1", "//T")
        assert [name for name, _ in headers] == ["traceparent"]
        ctx = tracing.context_of(headers)
        assert trace.get_current_span(ctx).get_span_context().trace_id == caller.get_span_context().trace_id
        after = tracing.receive_span("ns", "Q", [ctx, None], "conv-1")
        assert trace.get_current_span(after).get_span_context().trace_id == caller.get_span_context().trace_id
    finally:
        tracing.use_tracer_provider(None)
