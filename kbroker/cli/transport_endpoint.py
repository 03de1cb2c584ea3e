"""`kbroker endpoint`: the transport face's endpoints (NServiceBus's SQL Server transport).

kbroker endpoint install Sales --machine web-01       # queues Sales and Sales.web-01
kbroker endpoint send Sales --body '{"order": 1}' --header NServiceBus.EnclosedMessageTypes=OrderPlaced
kbroker endpoint send Billing --body later --delay 30  # moved to Billing in 30 s by its instances
kbroker endpoint receive Sales --wait 5 --json        # one message, removed when printed
kbroker endpoint acls Sales --installer User:deploy --runner User:sales
kbroker endpoint acls Sales --runner User:sales --sends-to Billing@finance   # and a queue of another namespace
"""

from __future__ import annotations

import sys

import click

from kbroker.cli.common import (
    cluster_options,
    emit_json,
    fail,
    handle_errors,
    json_option,
    main,
)


@main.group("endpoint")
def endpoint_group() -> None:
    """Transport endpoints: queues of transport messages, installers, send and receive."""


@endpoint_group.command("install")
@click.argument("endpoint")
@click.option(
    "--machine",
    help="The instance whose secondary queue ENDPOINT.MACHINE is created (default: this host's name, as the SDK's).",
)
@click.option("--no-secondary", is_flag=True, help="Only the primary queue (secondaries disabled).")
@click.option(
    "--partitions",
    type=click.IntRange(1, 1000),
    default=None,
    help="Partitions of the primary queue (default 4): at most this many instances compete.",
)
@cluster_options
@json_option
@handle_errors
def install_cmd(endpoint, machine, no_secondary, partitions, target, as_json):
    """Create ENDPOINT's queues (and the dead-letter topic), as an installer creates the tables.
    Needs topic-create rights; the running endpoint needs only read and write (see `acls`)."""
    from kbroker.core.transport.endpoint import PRIMARY_PARTITIONS, default_machine, install_plan, transport_queue_topic
    from kbroker.kafka.transport.queues import install

    ns = target.namespace
    machine = machine or default_machine()  # the endpoint's own default: its secondary queue is the one it reads
    plan = install_plan(endpoint, machine, secondary=not no_secondary, partitions=partitions or PRIMARY_PARTITIONS)
    created = install(target.cluster, ns, plan)
    rows = [
        {
            "queue": q,
            "topic": transport_queue_topic(ns, q),
            "partitions": p,
            "created": transport_queue_topic(ns, q) in created,
        }
        for q, p in plan.queues
    ]
    if as_json:
        emit_json({"endpoint": endpoint, "namespace": ns, "queues": rows, "created": created})
        return
    for r in rows:
        click.echo(
            f"{r['queue']}: {r['topic']} ({r['partitions']} partitions, "
            f"{'created' if r['created'] else 'already there'})"
        )


def header_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--header")
        out[name] = value
    return out


@endpoint_group.command("send")
@click.argument("queue")
@click.option("--body", help="The body (text); '-' reads it from standard input.")
@click.option("--header", "header", multiple=True, help="A header NAME=VALUE (repeatable).")
@click.option("--id", "message_id", help="The message Id (a GUID; default a new one).")
@click.option("--correlation-id")
@click.option("--reply-to", "reply_to", help="ReplyToAddress (default: none).")
@click.option("--not-recoverable", is_flag=True, help="Recoverable = false: the express, not durable path.")
@click.option("--ttbr", type=click.FloatRange(min=0, min_open=True), help="Time to be received, seconds (Expires).")
@click.option("--delay", type=click.FloatRange(min=0), help="Deliver after this many seconds (delayed delivery).")
@click.option("--not-before", "not_before", help="Deliver at this ISO 8601 time (UTC unless it has an offset).")
@click.option("--store", help="The endpoint whose delayed store holds a delayed send (default: the one QUEUE names).")
@cluster_options
@json_option
@handle_errors
def send_cmd(
    queue,
    body,
    header,
    message_id,
    correlation_id,
    reply_to,
    not_recoverable,
    ttbr,
    delay,
    not_before,
    store,
    target,
    as_json,
):
    """Send a transport message to QUEUE; prints its Id. With --delay or --not-before it waits in
    a delayed store (QUEUE's endpoint's, or --store's) until then, and that endpoint's running
    instances move it to QUEUE."""
    from kbroker.sdk.transport.endpoint import send_message

    if delay is not None and not_before is not None:
        fail("give --delay or --not-before, not both")
    delayed = {"delay": delay, "not_before": not_before} if delay is not None or not_before is not None else {}
    if store is not None:
        if not delayed:
            fail("--store is for a delayed send (--delay or --not-before)")
        delayed["delayed_store"] = store

    data = sys.stdin.buffer.read() if body == "-" else (None if body is None else body.encode())
    mid = send_message(
        target.cluster,
        target.namespace,
        queue,
        data,
        header_pairs(header),
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to_address=reply_to,
        recoverable=not not_recoverable,
        time_to_be_received=ttbr,
        **delayed,
    )
    if as_json:
        emit_json({"queue": queue, "Id": mid, **({"delay": delay, "not_before": not_before} if delayed else {})})
    else:
        click.echo(mid)


@endpoint_group.command("receive")
@click.argument("queue")
@click.option(
    "--wait", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Seconds to wait for a message."
)
@cluster_options
@json_option
@handle_errors
def receive_cmd(queue, wait, target, as_json):
    """Receive one message from QUEUE (removing it), in a transaction of its own."""
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    with TransportEndpoint(
        "kbroker-cli", cluster=target.cluster, namespace=target.namespace, secondary=False
    ) as ep:  # a receive reads QUEUE's group: the name plays no part
        msg = ep.receive(wait, queue=queue)
    if msg is None:
        if as_json:
            emit_json(None)
            return
        fail(f"no message on {queue} within {wait:g} s", code=3)
    row = msg.as_dict()
    if as_json:
        emit_json(row)
        return
    for name in ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "RowVersion"):
        click.echo(f"{name}: {row[name]}")
    for name, value in row["Headers"].items():
        click.echo(f"header {name}: {value}")
    click.echo(f"Body: {row['Body'] if row['Body'] is not None else row.get('body_hex', 'NULL')}")


@endpoint_group.command("acls")
@click.argument("endpoint")
@click.option("--installer", default="User:installer", show_default=True, help="The installing principal.")
@click.option("--runner", default="User:endpoint", show_default=True, help="The running endpoint's principal.")
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Create the ACLs (as a principal that may alter the cluster's ACLs) instead of printing kafka-acls.sh lines.",
)
@click.option(
    "--sends-to",
    "sends_to",
    multiple=True,
    metavar="QUEUE@NS",
    help="A queue of another namespace the endpoint sends (or delays, or replies) to: the runner may "
    "write it and its QUEUE.<machine> queues (repeatable).",
)
@cluster_options
@json_option
@handle_errors
def acls_cmd(endpoint, installer, runner, apply_, sends_to, target, as_json):
    """The Kafka ACLs that split ENDPOINT's permissions: the installer creates its topics, the
    running endpoint only reads and writes (roles transport-installer and transport-runner of
    `kbroker acls roles`), and writes the queues of other namespaces --sends-to names. Printed
    as kafka-acls.sh lines unless --apply."""
    from kbroker.core.security.acl_roles import transport_split

    bindings = transport_split(target.namespace, endpoint, installer, runner, sends_to=sends_to)
    if apply_:
        from kbroker.kafka.security.acls import grant

        grant(target.cluster, bindings)
    if as_json:
        emit_json([b.as_dict() for b in bindings])
        return
    address = str(target.explicit or "BOOTSTRAP")
    for b in bindings:
        click.echo(b.command(address))
