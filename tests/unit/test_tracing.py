"""The trace context in a message's headers (kbroker/tracing.py): what another client wrote there
is untrusted, so anything at all gives a context or None, never an error; a context kbroker wrote
comes back as the same trace."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from kbroker import tracing


@contextmanager
def recording() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    tracing.use_tracer_provider(provider)
    try:
        yield provider
    finally:
        tracing.use_tracer_provider(None)


@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=100)))
def test_any_traceparent_header_gives_a_context_or_none(traceparent, tracestate):
    headers = [("traceparent", traceparent)] + ([("tracestate", tracestate)] if tracestate is not None else [])
    with recording():
        ctx = tracing.context_of(headers)
    assert ctx is None or trace.get_current_span(ctx).get_span_context().is_valid


def test_no_trace_header_no_context():
    with recording():
        assert tracing.context_of(None) is None
        assert tracing.context_of([("kb.message_id", b"x")]) is None
        assert tracing.context_of([("traceparent", b"00-00000000000000000000000000000000-0000000000000000-01")]) is None


def test_with_the_api_installed_and_no_tracer_provider_nothing_is_traced():
    """The API alone records nothing, and its no-op spans cost 0.3 ms a message: none are made."""
    valid = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]
    assert tracing.otel_trace is not None and not tracing.enabled()
    assert tracing.send_headers("ns", "Q", "conv-1", "//T") == []
    assert tracing.context_of(valid) is None
    assert tracing.receive_span("ns", "Q", [None], "conv-1") is None
    assert tracing.with_trace_headers({"a": "b"}, "ns", "Q") == {"a": "b"}
    with tracing.traced("kbroker commit", None, "ns") as ctx:
        assert ctx is None
    with recording():  # a provider set later counts from the next statement
        assert tracing.enabled()
        assert tracing.context_of(valid) is not None
        assert [name for name, _ in tracing.send_headers("ns", "Q", "conv-1", "//T")] == ["traceparent"]
    assert not tracing.enabled()


def test_what_a_send_writes_a_receive_reads_as_the_same_trace():
    with recording() as provider:
        with provider.get_tracer("t").start_as_current_span("caller") as caller:
            headers = tracing.send_headers("ns", "Q", "conv-1", "//T")
        assert [name for name, _ in headers] == ["traceparent"]
        ctx = tracing.context_of(headers)
        assert trace.get_current_span(ctx).get_span_context().trace_id == caller.get_span_context().trace_id
        after = tracing.receive_span("ns", "Q", [ctx, None], "conv-1")
        assert trace.get_current_span(after).get_span_context().trace_id == caller.get_span_context().trace_id


GLOBAL_PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from kbroker import tracing
assert tracing.enabled() is {before}
trace.set_tracer_provider(TracerProvider())
assert tracing.enabled()
"""


@pytest.mark.parametrize("setting,before", [(None, False), ("sdk_tracer_provider", True)])
def test_the_global_provider_counts_set_in_code_or_by_the_setting(setting, before):
    """OpenTelemetry's own global provider (a process's, so asked in a child): set by the
    OTEL_PYTHON_TRACER_PROVIDER setting it counts from the start; set in code, from then on."""
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    if setting is not None:
        env["OTEL_PYTHON_TRACER_PROVIDER"] = setting
    run = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER.format(before=before)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
