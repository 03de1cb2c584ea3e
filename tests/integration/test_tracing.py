"""OpenTelemetry traces (kbroker/tracing.py) on the real broker, with OpenTelemetry's SDK and its
in-memory exporter: one request and its reply between two namespaces (through the transmission
topic, the transmitters and the far dispatchers) are one trace, each hop the child of the one
before, from the W3C context the messages carry in their `traceparent` header."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kbroker import tracing
from tests.integration.test_routing import CLIENT, CONTRACT, REPLY, REQUEST, SERVER, receive_all, two_namespaces


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


def test_a_request_and_its_reply_across_two_namespaces_are_one_trace(kafka_bootstrap, namespace, tmp_path, spans):
    a, b = namespace + "a", namespace + "b"
    app = TracerProvider().get_tracer("the application")  # the caller's own span, in its own provider
    with two_namespaces(kafka_bootstrap, tmp_path, a, b) as (ba, bb, _):
        with app.start_as_current_span("place order") as root:
            with ba.transaction() as tx:
                h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
                tx.send(h, REQUEST, {"order": 1})
        # B's handler: RECEIVE, then SEND the reply in the same transaction, with no tracing code.
        with bb.transaction() as tx:
            got = tx.receive("Q", top=1, wait=30)
            assert [m.message_type_name for m in got] == [REQUEST]
            assert (
                dict(got[0].extra["record"].headers())["traceparent"].decode().split("-")[1]
                == f"{root.get_span_context().trace_id:032x}"
            )
            tx.send(got[0].conversation_handle, REPLY, {"ok": True})
        replies = receive_all(ba, 1)
        assert [m.message_type_name for m in replies] == [REPLY]

    finished = spans.get_finished_spans()
    trace_id = root.get_span_context().trace_id
    ours = [s for s in finished if s.context.trace_id == trace_id]
    names_seen = sorted(
        (s.name, s.attributes.get("kbroker.namespace"), s.attributes.get("kbroker.message_type")) for s in ours
    )
    assert names_seen == sorted(
        [
            ("route send", a, REQUEST),
            ("kbroker commit", a, None),  # the request, routed to B
            ("Q receive", b, None),
            ("route send", b, REPLY),
            ("kbroker commit", b, None),  # B's handler
            ("Q receive", a, None),
            ("kbroker commit", a, None),
        ]
    ), names_seen  # the reply, received
    sends = sorted((s for s in ours if s.kind == SpanKind.PRODUCER), key=lambda s: s.start_time)
    receives = sorted((s for s in ours if s.kind == SpanKind.CONSUMER), key=lambda s: s.start_time)
    request_send, reply_send = sends
    request_receive, reply_receive = receives
    # The chain: the caller's span -> A's SEND -> B's RECEIVE -> B's SEND (the reply) -> A's RECEIVE.
    assert request_send.parent.span_id == root.get_span_context().span_id
    assert request_receive.parent.span_id == request_send.context.span_id
    assert reply_send.parent.span_id == request_receive.context.span_id
    assert reply_receive.parent.span_id == reply_send.context.span_id
    assert request_send.attributes["kbroker.namespace"] == a and request_receive.attributes["kbroker.namespace"] == b
    assert request_receive.attributes["messaging.destination.name"] == "Q"
    conversation = request_receive.attributes["messaging.message.conversation_id"]
    assert reply_receive.attributes["messaging.message.conversation_id"] == conversation
    # B's COMMIT is a child of its RECEIVE: the reply and the receive committed under one span.
    b_commit = next(s for s in ours if s.name == "kbroker commit" and s.attributes["kbroker.namespace"] == b)
    assert b_commit.parent.span_id == request_receive.context.span_id


def test_a_transport_request_handled_and_replied_to_is_one_trace(endpoints, spans):
    """The transport face (NServiceBus's): the context rides in the message's `traceparent`
    header, the name NServiceBus writes, and the handler's span sits between the receive and the
    reply it sends."""
    sales, billing = endpoints("Sales"), endpoints("Billing", machine="m2")
    app = TracerProvider().get_tracer("the application")
    with app.start_as_current_span("checkout") as root:
        sales.send("Billing", b"invoice me", {"NServiceBus.EnclosedMessageTypes": "Invoice"}, reply_to_address="Sales")
    seen: list = []

    def handler(msg, tx):
        seen.append(msg)
        tx.reply(msg, b"invoiced")

    assert billing.handle_one("Billing", handler, wait=15)
    assert seen and seen[0].headers["traceparent"].split("-")[1] == f"{root.get_span_context().trace_id:032x}"
    assert seen[0].headers["NServiceBus.EnclosedMessageTypes"] == "Invoice"
    reply = sales.receive(wait=15)
    assert reply is not None and reply.body == b"invoiced"

    ours = [s for s in spans.get_finished_spans() if s.context.trace_id == root.get_span_context().trace_id]
    by_name = {s.name: s for s in ours if s.name != "kbroker commit"}
    assert sorted(by_name) == ["Billing process", "Billing receive", "Billing send", "Sales receive", "Sales send"]
    assert by_name["Billing send"].parent.span_id == root.get_span_context().span_id
    assert by_name["Billing receive"].parent.span_id == by_name["Billing send"].context.span_id
    assert by_name["Billing process"].parent.span_id == by_name["Billing receive"].context.span_id
    assert by_name["Sales send"].parent.span_id == by_name["Billing process"].context.span_id
    assert by_name["Sales receive"].parent.span_id == by_name["Sales send"].context.span_id
    assert len([s for s in ours if s.name == "kbroker commit"]) == 2  # Billing's handler, Sales's receive


def test_an_asyncio_handler_s_span_is_the_parent_of_what_it_sends(kafka_bootstrap, namespace, endpoints, spans):
    """The asyncio face runs the handler on the event loop and its sends on the endpoint's
    threads: the handler's span goes with them (the context copied), so the reply is its child."""
    import asyncio

    from kbroker import transport

    sales = endpoints("Sales")
    endpoints("Billing", machine="m2")  # installed; the asyncio instance below reads it
    app = TracerProvider().get_tracer("the application")
    with app.start_as_current_span("checkout") as root:
        sales.send("Billing", b"invoice me", reply_to_address="Sales")

    async def main() -> None:
        ep = await transport.async_endpoint("Billing", bootstrap=kafka_bootstrap, namespace=namespace, machine="m2")
        replied = asyncio.Event()

        async def handle(msg, tx) -> None:
            await asyncio.sleep(0)  # the span outlives an await
            await tx.reply(msg, b"invoiced")
            replied.set()

        try:
            await ep.start(handle)
            await asyncio.wait_for(replied.wait(), 30)
        finally:
            await ep.close()

    asyncio.run(main())
    reply = sales.receive(wait=15)
    assert reply is not None and reply.body == b"invoiced"
    ours = [s for s in spans.get_finished_spans() if s.context.trace_id == root.get_span_context().trace_id]
    by_name = {s.name: s for s in ours if s.name != "kbroker commit"}
    assert {"Billing send", "Billing receive", "Billing process", "Sales send"} <= set(by_name), sorted(by_name)
    assert by_name["Billing process"].parent.span_id == by_name["Billing receive"].context.span_id
    assert by_name["Sales send"].parent.span_id == by_name["Billing process"].context.span_id


def test_a_forged_trace_header_starts_a_trace_of_its_own_and_the_message_goes_through(endpoints, spans):
    """`traceparent` is what any sender wrote: garbage there (and an oversize `tracestate`) is no
    context, so the receive starts a trace of its own, and the handler and its reply go on."""
    sales, billing = endpoints("Sales"), endpoints("Billing", machine="m2")
    sales.send(
        "Billing",
        b"invoice me",
        {"traceparent": "00-zz-not-a-trace", "tracestate": "k=" + "v" * 20_000},
        reply_to_address="Sales",
    )
    assert billing.handle_one("Billing", lambda msg, tx: tx.reply(msg, b"invoiced"), wait=15)
    reply = sales.receive(wait=15)
    assert reply is not None and reply.body == b"invoiced"
    received = [s for s in spans.get_finished_spans() if s.name == "Billing receive"]
    assert len(received) == 1 and received[0].parent is None  # a root: nothing was taken from the header
    replied = next(s for s in spans.get_finished_spans() if s.name == "Sales receive")
    assert replied.context.trace_id == received[0].context.trace_id  # the reply continues the new trace
