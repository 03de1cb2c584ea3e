"""`kbroker transmission` (sys.transmission_queue), `kbroker connections`
(sys.dm_broker_connections) and `kbroker forwarded` (sys.dm_broker_forwarded_messages): what the
namespace's transmitters and forwarders hold and how their connections stand, from their reports
on the link reports topic (kafka/routing/views.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from kbroker.cli.common import (
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    main,
)
from kbroker.cli.output import new_table, print_table


def _time(epoch: float | None) -> str:
    return "-" if not epoch else datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S")


@main.command("transmission")
@cluster_options
@click.option(
    "--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True, help="Messages to list at most."
)
@json_option
@handle_errors
def transmission_cmd(target, limit, as_json):
    """Messages sent to other namespaces and not yet acknowledged (sys.transmission_queue), with
    why each waits; a blank status means no send was tried yet."""
    from kbroker.kafka.routing.views import transmission_rows

    ns = target.namespace
    rows = transmission_rows(target.cluster, ns, limit)
    if as_json:
        emit_json(rows)
        return
    t = new_table(
        f"transmission queue of {ns} ({len(rows)} messages)",
        "enqueued",
        "conversation",
        "seq",
        "type",
        "to service",
        "destination",
        "tries",
        "transmission_status",
    )
    for r in rows:
        t.add_row(
            _time(r["enqueue_time"]),
            r["conversation_id"][:8],
            str(r["message_sequence_number"]),
            r["message_type_name"].rsplit("/", 1)[-1],
            r["to_service_name"],
            r["destination"] or "-",
            str(r["attempts"]),
            r["transmission_status"] or "",
        )
    print_table(t)


@main.command("connections")
@cluster_options
@json_option
@handle_errors
def connections_cmd(target, as_json):
    """The transmitters' connections to other namespaces (sys.dm_broker_connections)."""
    from kbroker.kafka.routing.views import connection_rows

    ns = target.namespace
    rows = connection_rows(target.cluster, ns)
    if as_json:
        emit_json(rows)
        return
    t = new_table(
        f"connections of {ns}",
        "destination",
        "state",
        "connected",
        "last activity",
        "sends",
        "acks",
        "bytes",
        "suppressed",
        "last error",
    )
    for r in rows:
        t.add_row(
            r["destination"],
            r["state"],
            _time(r["connect_time"]),
            _time(r["last_activity_time"]),
            str(r["total_sends"]),
            str(r["total_acks"]),
            str(r["total_bytes"]),
            f"{r['suppressed_for']:.0f} s" if r["suppressed_for"] else "-",
            r["last_error"] or "",
        )
    print_table(t)


@main.command("forwarded")
@cluster_options
@json_option
@handle_errors
def forwarded_cmd(target, as_json):
    """Messages this namespace is forwarding to other namespaces (sys.dm_broker_forwarded_messages);
    only with a broker endpoint of MESSAGE_FORWARDING = ENABLED."""
    from kbroker.kafka.routing.views import forwarded_rows

    ns = target.namespace
    rows = forwarded_rows(target.cluster, ns)
    if as_json:
        emit_json(rows)
        return
    t = new_table(
        f"forwarded messages of {ns}",
        "conversation",
        "seq",
        "to service",
        "from",
        "next hop",
        "bytes",
        "time consumed",
        "time to live",
    )
    for r in rows:
        t.add_row(
            r["conversation_id"][:8],
            str(r["message_sequence_number"]),
            r["to_service_name"],
            r["from_broker_instance"],
            r["adjacent_broker_address"],
            str(r["size"]),
            f"{r['time_consumed']:.1f} s",
            f"{r['time_to_live']:.1f} s",
        )
    print_table(t)
