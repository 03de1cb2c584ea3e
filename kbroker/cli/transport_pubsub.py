"""`kbroker endpoint subscribe | unsubscribe | publish | subscriptions`: the transport face's
publish/subscribe (the namespace's subscription table).

    kbroker endpoint subscribe Billing --type Sales.Messages.OrderPlaced
    kbroker endpoint publish Sales --type Sales.Messages.OrderPlaced --body '{"order": 1}'
    kbroker endpoint subscriptions --json
"""

from __future__ import annotations

import sys

import click

from kbroker.cli.common import cluster_options, emit_json, handle_errors, json_option
from kbroker.cli.transport_endpoint import endpoint_group, header_pairs


def _endpoint(name, target, **kw):
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    return TransportEndpoint(name, cluster=target.cluster, namespace=target.namespace, secondary=False, **kw)


@endpoint_group.command("subscribe")
@click.argument("endpoint")
@click.option("--type", "event_type", required=True, help="The event type (its full name).")
@click.option("--queue", help="Where the copies go (default: ENDPOINT's primary queue).")
@cluster_options
@json_option
@handle_errors
def subscribe_cmd(endpoint, event_type, queue, target, as_json):
    """Subscribe ENDPOINT to events of --type and of the types derived from it."""
    with _endpoint(endpoint, target) as ep:
        sub = ep.subscribe(event_type, queue=queue)
    if as_json:
        emit_json(sub.as_dict())
    else:
        click.echo(f"{sub.endpoint} subscribed to {sub.type} (copies to {sub.queue})")


@endpoint_group.command("unsubscribe")
@click.argument("endpoint")
@click.option("--type", "event_type", required=True, help="The event type (its full name).")
@cluster_options
@json_option
@handle_errors
def unsubscribe_cmd(endpoint, event_type, target, as_json):
    """End ENDPOINT's subscription to --type."""
    with _endpoint(endpoint, target) as ep:
        ep.unsubscribe(event_type)
    if as_json:
        emit_json({"endpoint": endpoint, "type": event_type, "subscribed": False})
    else:
        click.echo(f"{endpoint} unsubscribed from {event_type}")


@endpoint_group.command("publish")
@click.argument("endpoint")
@click.option(
    "--type",
    "event_types",
    multiple=True,
    help="The event type, then its base types (repeatable; default: the "
    "types the NServiceBus.EnclosedMessageTypes header names).",
)
@click.option("--body", help="The body (text); '-' reads it from standard input.")
@click.option("--header", "header", multiple=True, help="A header NAME=VALUE (repeatable).")
@click.option("--id", "message_id", help="The event's Id (a GUID; default a new one).")
@cluster_options
@json_option
@handle_errors
def publish_cmd(endpoint, event_types, body, header, message_id, target, as_json):
    """Publish an event as ENDPOINT: one copy to every endpoint subscribed to one of its types, in
    one transaction. Prints its Id and where the copies went."""
    from kbroker.sdk.transport.publishing import event_types as types_of

    data = sys.stdin.buffer.read() if body == "-" else (None if body is None else body.encode())
    headers = header_pairs(header)
    with _endpoint(endpoint, target, send_only=True) as ep:
        # The copy of the table the publish reads (it is read at most once in 5 s: the same one).
        queues = [s.queue for s in ep.runtime.subscriptions().subscribers(types_of(list(event_types) or None, headers))]
        mid = ep.publish(list(event_types) or None, data, headers, message_id=message_id)
    if as_json:
        emit_json({"Id": mid, "queues": queues})
    else:
        click.echo(mid)
        for q in queues:
            click.echo(f"  to {q}")


@endpoint_group.command("subscriptions")
@cluster_options
@json_option
@handle_errors
def subscriptions_cmd(target, as_json):
    """The namespace's subscription table: who receives which event types, and where."""
    from kbroker.kafka.transport.subscription_store import SubscriptionCache

    cache = SubscriptionCache(target.cluster, target.namespace)
    try:
        subs = cache.all()
    finally:
        cache.close()
    if as_json:
        emit_json([s.as_dict() for s in subs])
        return
    if not subs:
        click.echo("no subscriptions")
    for s in subs:
        click.echo(f"{s.type}: {s.endpoint} (to {s.queue})")
