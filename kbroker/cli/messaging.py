"""`kbroker send`, `receive`, `end`: BEGIN DIALOG + SEND, RECEIVE, END CONVERSATION."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kbroker.cli.common import (
    Target,
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    main,
    require_extra,
)

if TYPE_CHECKING:
    from kbroker.sdk.broker import Broker


def _connect(target: Target) -> Broker:
    # The SDK (and its Kafka client) loads when a command runs, not for `kbroker --help`.
    from kbroker.sdk.broker import connect

    return connect(target.cluster, target.namespace)


def read_body(body: str) -> bytes:
    """TEXT, or @FILE for a file's bytes (@@ escapes a literal leading @)."""
    if body.startswith("@@"):
        return body[1:].encode()
    if body.startswith("@"):
        path = Path(body[1:])
        if not path.is_file():
            raise FileNotFoundError(f"body file {path} does not exist")
        return path.read_bytes()
    return body.encode()


@main.command()
@click.option("--from", "from_service", help="Initiating service (for a new dialog).")
@click.option("--to", "to_service", help="Target service (for a new dialog).")
@click.option("--contract", default="DEFAULT", show_default=True, help="Contract of a new dialog.")
@click.option("--type", "message_type", default="DEFAULT", show_default=True, help="Message type.")
@click.option("--body", default="", help="Body text, or @FILE.")
@click.option("--conversation", "handle", help="Send on this existing conversation handle.")
@click.option("--lifetime", type=int, help="Dialog lifetime in seconds (new dialog).")
@click.option("--related-group", help="RELATED_CONVERSATION_GROUP of a new dialog (a GUID).")
@click.option("--instance", help="Replies to a new dialog go to this instance's secondary queue.")
@cluster_options
@json_option
@handle_errors
def send(
    from_service, to_service, contract, message_type, body, handle, lifetime, related_group, instance, target, as_json
):
    """SEND a message, beginning a dialog unless --conversation is given."""
    data = read_body(body)
    if handle is None and not (from_service and to_service):
        raise ValueError("give --conversation HANDLE, or --from and --to to begin a dialog")
    with _connect(target) as broker:
        if handle is None:
            # BEGIN DIALOG and its first SEND as one transaction: a SEND refused (an unknown
            # message type, say) leaves no endpoint behind.
            with broker.transaction() as tx:
                handle = tx.begin_dialog(
                    from_service,
                    to_service,
                    contract,
                    lifetime=lifetime,
                    related_conversation_group=related_group,
                    instance=instance,
                )
                message_id = tx.send(handle, message_type, data)
        else:
            message_id = broker.send(handle, message_type, data)
    if as_json:
        emit_json({"conversation_handle": handle, "message_id": message_id})
    else:
        click.echo(f"conversation_handle {handle}\nmessage_id {message_id}")


@main.command()
@click.argument("queue")
@click.option(
    "--top",
    default=None,
    type=click.IntRange(min=1),
    help="TOP(n). Without it, every ready message of one conversation group (RECEIVE without TOP).",
)
@click.option(
    "--wait", default=0.0, show_default=True, type=click.FloatRange(min=0), help="WAITFOR time-out in seconds."
)
@click.option("--conversation", "handle", help="Only this conversation (WHERE conversation_handle).")
@click.option("--group", help="Only this conversation group (WHERE conversation_group_id).")
@click.option("--instance", help="Receive from this instance's secondary queue of QUEUE.")
@cluster_options
@json_option
@handle_errors
def receive(queue, top, wait, handle, group, instance, target, as_json):
    """RECEIVE from QUEUE: prints one JSON object per message (one conversation group)."""
    with _connect(target) as broker:
        msgs = broker.receive(
            queue, top=top, wait=wait, conversation_handle=handle, conversation_group=group, instance=instance
        )
    for m in msgs:
        emit_json(m.as_dict())


@main.command()
@click.argument("handle")
@click.option("--error", type=int, help="END CONVERSATION WITH ERROR = code (a positive integer).")
@click.option("--description", help="Error description (with --error).")
@click.option("--cleanup", is_flag=True, help="WITH CLEANUP: remove the local endpoint silently.")
@cluster_options
@json_option
@handle_errors
def end(handle, error, description, cleanup, target, as_json):
    """END CONVERSATION on HANDLE."""
    if description is not None and error is None:
        raise ValueError("--description goes with --error")
    with _connect(target) as broker:
        broker.end_conversation(handle, error=error, description=description, cleanup=cleanup)
        state = broker.endpoints.find(handle)
    result = {"conversation_handle": handle, "state": state.state if state else "removed"}
    if as_json:
        emit_json(result)
    else:
        click.echo(f"conversation {handle} ended ({result['state']})")


@main.command()
@click.argument("handle")
@click.argument("group")
@cluster_options
@json_option
@handle_errors
def move(handle, group, target, as_json):
    """MOVE CONVERSATION HANDLE TO GROUP (a GUID; groups of the same queue only)."""
    with _connect(target) as broker:
        broker.move_conversation(handle, group)
        ep = broker.endpoints.get(handle)
    if as_json:
        emit_json({"conversation_handle": handle, "conversation_group_id": ep.conversation_group_id})
    else:
        click.echo(f"conversation {handle} moved to group {ep.conversation_group_id}")


@main.command()
@click.option("--keep-broker", is_flag=True, help="Leave the embedded broker running afterwards.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded broker data dir (default: KBROKER_DATA_DIR, else the per-user one).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=9092,
    show_default=True,
    help="Port of the embedded broker the demo starts (when none runs in its data dir).",
)
@click.option(
    "--analytics",
    is_flag=True,
    help="Then run a sample workload under the Spark analytics job (and a worker) and show its results.",
)
@cluster_options
@json_option
@handle_errors
def demo(keep_broker, data_dir, port, analytics, target, as_json):
    """Run the sample expense conversation end to end (starts the embedded broker if needed)."""
    from kbroker.cli.demo import run_demo

    if analytics:
        require_extra("analytics", "pyspark")
        require_extra("worker", "faust", "aiokafka")
    run_demo(
        cluster=target.explicit,
        namespace=target.namespace,
        data_dir=data_dir,
        port=port,
        keep_broker=keep_broker,
        as_json=as_json,
        analytics=analytics,
    )
