"""`kbroker queue show|messages|enable|disable` and `kbroker conversations`: ALTER QUEUE ... STATUS and the
DMV-like views of kbroker/queues.py."""

from __future__ import annotations

import click

from kbroker.cli.common import (
    Target,
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    main,
    web_port_option,
    web_token_file_option,
    web_urls,
)
from kbroker.cli.output import make_console, new_table, print_table


@main.group("queue")
def queue_group():
    """Show a queue's depth and readers, or enable / disable it (ALTER QUEUE ... STATUS)."""


@queue_group.command("show")
@click.argument("queue")
@cluster_options
@json_option
@handle_errors
def show_cmd(queue, target, as_json):
    """Status, messages ready per partition (counted, or an upper bound past 10,000 records) and
    the reading consumer group."""
    from kbroker.kafka.queue_views import queue_view

    view = queue_view(target.cluster, target.namespace, queue)
    if as_json:
        emit_json(view)
        return
    g = view["group"]
    console = make_console()
    console.print(
        f"queue {view['queue']}: status {view['status']}, poison message handling "
        f"{view['poison_message_handling']}, {g['members']} readers (group {g['state'].lower()})",
        highlight=False,
    )
    # Counted when the queue is small enough to read (queue_view's EXACT_READY), else an upper
    # bound, and the column says which.
    ready = "ready" if view["totals"]["ready_exact"] else "ready (at most)"
    t = new_table(view["topic"], "partition", "log start", "end", "committed", "completed above", ready, "bytes")
    for p in view["partition_offsets"]:
        committed = "-" if p["committed"] is None else str(p["committed"])
        t.add_row(
            str(p["partition"]),
            str(p["start"]),
            str(p["end"]),
            committed,
            str(p["completed_above"]),
            str(p["ready"]),
            _maybe(p["bytes"]),
        )
    totals = view["totals"]
    t.add_row(
        "total",
        "",
        str(totals["end"]),
        "",
        str(totals["completed_above"]),
        str(totals["ready"]),
        _maybe(totals["bytes"]),
    )
    print_table(t, console)
    console.print(
        f"{view['locked_groups']} conversation groups locked, {view['in_flight']} messages in flight "
        f"(open transactions), {len(view['readers'])} reading processes",
        highlight=False,
    )
    if view["readers"]:
        r = new_table("readers", "process", "partitions", "buffered", "ready groups", "locked groups", "in flight")
        for row in view["readers"]:
            r.add_row(
                row["process"],
                ",".join(map(str, row["partitions"])),
                str(row["buffered"]),
                str(row["ready_groups"]),
                str(row["locked_groups"]),
                str(row["in_flight"]),
            )
        print_table(r, console)


def _maybe(value: int | None) -> str:
    return "?" if value is None else str(value)


@queue_group.command("messages")
@click.argument("queue")
@click.option("--conversation", "handle", help="Only this conversation handle's messages.")
@cluster_options
@json_option
@handle_errors
def messages_cmd(queue, handle, target, as_json):
    """The queue's messages, like SELECT * FROM queue: status 1 = ready; with RETENTION = ON, until
    the conversation ends, also 0 = received and 3 = sent by this queue's services."""
    from kbroker.kafka.receive.retention import queue_messages

    rows = queue_messages(target.cluster, target.namespace, queue, handle)
    if as_json:
        emit_json(rows)
        return
    t = new_table(f"queue {queue}", "status", "order", "conversation_handle", "seq", "message_type_name", "body")
    t.columns[2].no_wrap = True
    for r in rows:
        body = r["message_body"] if r["message_body"] is not None else f"0x{r['message_body_hex'][:40]}"
        t.add_row(
            str(r["status"]),
            str(r["queuing_order"]),
            r["conversation_handle"],
            str(r["message_sequence_number"]),
            r["message_type_name"],
            body[:60],
        )
    print_table(t)


def _set_status(queue: str, status: str, reason: str, target: Target, as_json: bool) -> None:
    from kbroker.kafka.queue_views import set_queue_status

    set_queue_status(target.cluster, target.namespace, queue, status, reason)
    if as_json:
        emit_json({"queue": queue, "status": status, "reason": reason})
    else:
        click.echo(f"queue {queue} {'enabled' if status == 'ON' else 'disabled'} (STATUS = {status})")


@queue_group.command("enable")
@click.argument("queue")
@click.option("--reason", default="enabled by an operator", show_default=True, help="Recorded in the event.")
@cluster_options
@json_option
@handle_errors
def enable_cmd(queue, reason, target, as_json):
    """ALTER QUEUE QUEUE WITH STATUS = ON."""
    _set_status(queue, "ON", reason, target, as_json)


@queue_group.command("disable")
@click.argument("queue")
@click.option("--reason", default="disabled by an operator", show_default=True, help="Recorded in the event.")
@cluster_options
@json_option
@handle_errors
def disable_cmd(queue, reason, target, as_json):
    """ALTER QUEUE QUEUE WITH STATUS = OFF: no RECEIVE from it until it is enabled again."""
    _set_status(queue, "OFF", reason, target, as_json)


@main.command("conversations")
@click.option("--state", help="Only endpoints in this state (SO, CO, DI, DO, ER, CD).")
@click.option(
    "--url",
    default=None,
    help="A worker's HTTP API, whose view is kept in memory (default: this host's, at --web-port); "
    "without a worker of this namespace answering there, the endpoints topic is read.",
)
@web_port_option
@web_token_file_option
@cluster_options
@json_option
@handle_errors
def conversations_cmd(state, url, web_port, web_token_file, target, as_json):
    """The conversation endpoints of the namespace (sys.conversation_endpoints)."""
    from kbroker.kafka.queue_views import conversation_view
    from kbroker.worker.web.views import worker_conversations

    ns = target.namespace
    rows = worker_conversations(web_urls(url, web_port)[0], ns, token_file=web_token_file)
    if rows is None:
        rows = conversation_view(target.cluster, ns)
    if state:
        rows = [r for r in rows if r["state"] == state.upper()]
    if as_json:
        emit_json(rows)
        return
    # The columns that fit a terminal; --json has them all (contract, group, lifetime, ...).
    t = new_table("conversation endpoints", "conversation_handle", "side", "service", "far service", "state", "seq")
    t.columns[0].no_wrap = True  # a handle is copied and pasted: keep it on one line
    for r in rows:
        t.add_row(
            r["conversation_handle"],
            "I" if r["is_initiator"] else "T",
            r["service_name"],
            r["far_service"],
            r["state"],
            str(r["send_sequence"]),
        )
    print_table(t)
