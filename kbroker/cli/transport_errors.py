"""`kbroker endpoint errors | retry`: the error queue's failed messages, and sending them back.

kbroker endpoint errors --json                       # what failed, where, why
kbroker endpoint retry 0f8fad5b-d9cb-469f-a165-70867728950e
kbroker endpoint retry --endpoint Billing            # every message Billing failed
kbroker endpoint retry --all
"""

from __future__ import annotations

import click

from kbroker.cli.common import cluster_options, emit_json, fail, handle_errors, json_option
from kbroker.cli.transport_endpoint import endpoint_group
from kbroker.core.transport.endpoint import ERROR_QUEUE


def _row(msg) -> dict:
    from kbroker.core.transport.recoverability import (
        EXCEPTION_MESSAGE,
        EXCEPTION_TYPE,
        FAILED_Q,
        PROCESSING_ENDPOINT,
        RETRIES,
        TIME_OF_FAILURE,
    )

    h = msg.headers
    return {
        "Id": msg.id,
        "endpoint": h.get(PROCESSING_ENDPOINT),
        "failed_queue": h.get(FAILED_Q),
        "time_of_failure": h.get(TIME_OF_FAILURE),
        "exception_type": h.get(EXCEPTION_TYPE),
        "message": h.get(EXCEPTION_MESSAGE),
        "delayed_retries": h.get(RETRIES, "0"),
        "partition": msg.partition,
        "offset": msg.row_version,
    }


@endpoint_group.command("errors")
@click.option("--queue", default=ERROR_QUEUE, show_default=True, help="The error queue.")
@click.option("--endpoint", help="Only messages this endpoint failed.")
@click.option("--type", "exception_type", help="Only failures of this exception type (full or last part).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@cluster_options
@json_option
@handle_errors
def errors_cmd(queue, endpoint, exception_type, limit, target, as_json):
    """The failed messages waiting in the error queue: which endpoint failed them, when, why."""
    from kbroker.kafka.transport.error_queue import waiting

    found, total = waiting(target.cluster, target.namespace, queue, limit=limit)
    rows = [_row(m) for m in found]
    if endpoint is not None:
        rows = [r for r in rows if r["endpoint"] == endpoint]
    if exception_type is not None:
        rows = [
            r for r in rows if exception_type in (r["exception_type"], (r["exception_type"] or "").rsplit(".", 1)[-1])
        ]
    if as_json:
        emit_json({"queue": queue, "waiting": total, "messages": rows})
        return
    click.echo(f"{total} waiting in {queue}" + (f" (first {limit} read)" if total > limit else ""))
    for r in rows:
        click.echo(
            f"{r['Id']}  {r['time_of_failure']}  {r['endpoint']} ({r['failed_queue']})  "
            f"{r['exception_type']}: {r['message']}"
        )


@endpoint_group.command("retry")
@click.argument("ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every failed message.")
@click.option("--endpoint", help="Every message this endpoint failed.")
@click.option("--queue", default=ERROR_QUEUE, show_default=True, help="The error queue.")
@cluster_options
@json_option
@handle_errors
def retry_cmd(ids, every, endpoint, queue, target, as_json):
    """Send failed messages back to the queues they failed in (IDS, --endpoint or --all), each
    exactly once, in the transaction that removes it from the error queue."""
    from kbroker.sdk.transport.error_retry import chooser, retry_failed

    if sum((bool(ids), every, endpoint is not None)) != 1:
        fail("name the messages: IDS, --endpoint E or --all (one of them)")

    def progress(done: int, total: int) -> None:
        if not as_json and (done % 100 == 0 or done == total):
            click.echo(f"  {done}/{total} looked at", err=True)

    out = retry_failed(target.cluster, target.namespace, chooser(ids, endpoint, every), queue=queue, progress=progress)
    missing = sorted(set(ids) - set(out.sent_back) - set(out.unretriable))
    if as_json:
        emit_json({**out.as_dict(), "not_found": missing})
    else:
        click.echo(f"{len(out.sent_back)} sent back, {out.kept} kept in {queue}")
        for mid in out.unretriable:
            click.echo(f"  {mid}: kept: its FailedQ names no installed queue")
        for mid in missing:
            click.echo(f"  {mid}: not in {queue}")
    if missing:
        raise SystemExit(3)
