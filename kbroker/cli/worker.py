"""`kbroker worker` (queue monitors, activation, the tick, timers), its views `kbroker monitors`
and `kbroker tasks`, and `kbroker queue alter` (ALTER QUEUE ... WITH ACTIVATION)."""

from __future__ import annotations

import click

from kbroker.cli.common import (
    cluster_options,
    emit_json,
    fail,
    handle_errors,
    json_option,
    log_format_option,
    main,
    require_extra,
    setup_logging,
    web_port_option,
    web_token_file_option,
    web_urls,
)
from kbroker.cli.output import new_table, print_table
from kbroker.cli.views import queue_group
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import CLOSED_GRACE_SECONDS


@main.command("worker")
@cluster_options
@click.option(
    "--web-host",
    default="127.0.0.1",
    show_default=True,
    envvar="KBROKER_WEB_HOST",
    help="Address the worker's HTTP API binds to (0.0.0.0: every interface, as in a container; "
    "any address but loopback needs a token); env KBROKER_WEB_HOST.",
)
@web_port_option
@web_token_file_option
@click.option(
    "--web-allowed-host",
    "web_allowed_hosts",
    multiple=True,
    envvar="KBROKER_WEB_ALLOWED_HOSTS",
    metavar="NAME[,NAME...]",
    help="Host names the HTTP API answers for besides --web-host and the loopback names (the "
    "name in the address browsers use; '.example.com': every name under it). Repeatable; "
    "env KBROKER_WEB_ALLOWED_HOSTS.",
)
@click.option(
    "--tick", "tick", type=click.FloatRange(min=0.5), default=5.0, show_default=True, help="Seconds between ticks."
)
@click.option(
    "--ramp-up",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds of RECEIVEs with none empty before the monitor adds a reader.",
)
@click.option("--handlers", type=click.IntRange(1, 1024), default=None, help="Task handler threads (default 2 x CPUs).")
@click.option(
    "--receiver-idle",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds a queue's receiver may sit unread by activated readers before it is closed "
    "(its partitions go to the queue's other readers).",
)
@click.option("--no-timers", is_flag=True, help="Do not run the timer service in this worker.")
@click.option(
    "--no-routing",
    is_flag=True,
    help="Do not run the dispatcher and transmitter (messages between namespaces) in this worker.",
)
@click.option(
    "--allow-procedures",
    "allow_procedures",
    multiple=True,
    envvar="KBROKER_ALLOW_PROCEDURES",
    metavar="MODULE[,MODULE...]",
    help="Modules (or packages) whose activation procedures this worker runs, besides kbroker's "
    "samples (kbroker.samples); a queue naming another is not activated. Repeatable; env "
    "KBROKER_ALLOW_PROCEDURES.",
)
@click.option(
    "--closed-grace",
    type=click.FloatRange(min=0),
    default=CLOSED_GRACE_SECONDS,
    show_default=True,
    help="Seconds a CLOSED conversation endpoint is kept before the worker tombstones it.",
)
@click.option(
    "--monitor-partitions",
    type=click.IntRange(1, 1024),
    default=names.MONITOR_PARTITIONS,
    show_default=True,
    envvar="KBROKER_MONITOR_PARTITIONS",
    help="Partitions of the namespace's monitor-events topic when this worker creates it (the "
    "first worker of a namespace): up to this many workers share the namespace's queue monitors "
    "and activated readers. An existing topic keeps its count; env KBROKER_MONITOR_PARTITIONS.",
)
@click.option("--loglevel", default="info", show_default=True)
@log_format_option
@handle_errors
def worker_cmd(
    target,
    web_host,
    web_port,
    web_token_file,
    web_allowed_hosts,
    tick,
    ramp_up,
    handlers,
    receiver_idle,
    no_timers,
    no_routing,
    allow_procedures,
    closed_grace,
    monitor_partitions,
    loglevel,
    log_format,
):
    """Run the worker: queue monitors with internal and external activation, task handlers, the
    cluster tick, the timer service, and the dispatcher and transmitter that carry messages between
    namespaces. Start several; they share the work through Kafka."""
    require_extra("worker", "faust", "aiokafka")
    from kbroker.config import web_token
    from kbroker.worker.app import WorkerSettings, run_worker

    settings = WorkerSettings(
        target.cluster,
        target.namespace,
        web_host=web_host,
        web_port=web_port,
        web_token=web_token(web_token_file),
        web_allowed_hosts=_names(web_allowed_hosts),
        tick_interval=tick,
        ramp_up=ramp_up,
        handlers=handlers,
        receiver_idle=receiver_idle,
        timers=not no_timers,
        routing=not no_routing,
        closed_grace=closed_grace,
        allow_procedures=_names(allow_procedures),
        log_format=log_format,
        monitor_partitions=monitor_partitions,
    )
    setup_logging(loglevel, log_format, namespace=settings.namespace, worker=settings.worker_id)
    run_worker(settings, loglevel=loglevel)


def _names(values: tuple[str, ...]) -> tuple[str, ...]:
    """A repeatable option's values, each of which may list several, split on commas and spaces."""
    return tuple(n for value in values for n in value.replace(" ", ",").split(",") if n)


@main.command("monitors")
@cluster_options
@json_option
@handle_errors
def monitors_cmd(target, as_json):
    """Queue monitors, like sys.dm_broker_queue_monitors (read from Kafka; no worker needed)."""
    from kbroker.worker.web.views import monitor_rows

    rows = monitor_rows(target.cluster, target.namespace)
    if as_json:
        emit_json(rows)
        return
    cols = (
        "queue",
        "state",
        "activation",
        "readers",
        "max_queue_readers",
        "tasks_waiting",
        "backlog",
        "ready_groups",
        "last_activated_time",
        "last_empty_rowset_time",
        "worker",
    )
    t = new_table("queue monitors", *cols, "degraded")
    for r in rows:
        t.add_row(*("" if r[c] is None else str(r[c]) for c in cols), degraded_cell(r))
    print_table(t)


def degraded_cell(row: dict) -> str:
    """The `degraded` column of a monitor row: empty when its owner was healthy, else DEGRADED
    and the failing components (`component: error`, the error cut short; --json has it whole)."""
    if not row.get("degraded"):
        return ""
    reasons = [f"{r.get('component', '?')}: {str(r.get('error', ''))[:60]}" for r in row.get("degraded_reasons") or []]
    return "DEGRADED" + (" (" + "; ".join(reasons) + ")" if reasons else "")


@main.command("tasks")
@click.option(
    "--url",
    "urls",
    multiple=True,
    help="A worker's HTTP API; repeat for several workers (default: this host's, at --web-port).",
)
@web_port_option
@web_token_file_option
@json_option
@handle_errors
def tasks_cmd(urls, web_port, web_token_file, as_json):
    """Activated readers running now, like sys.dm_broker_activated_tasks (asks the workers)."""
    from kbroker.config import web_token
    from kbroker.worker.web.web_client import get_json

    token = web_token(web_token_file)
    rows = []
    for url in web_urls(urls, web_port):
        try:
            rows.extend(get_json(url, "/tasks/", token=token)["tasks"])
        except OSError as exc:  # refused, timed out, or an HTTP error status (URLError is an OSError)
            fail(f"worker at {url} does not answer: {exc}")
    if as_json:
        emit_json(rows)
        return
    cols = ("task_id", "worker", "queue", "procedure", "generation", "handler", "started_at")
    t = new_table("activated tasks", *cols)
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    print_table(t)


@queue_group.command("alter")
@click.argument("queue")
@click.option(
    "--activation",
    type=click.Choice(["on", "off", "drop"], case_sensitive=False),
    default=None,
    help="ACTIVATION STATUS (off then on recycles the queue's monitor), or ACTIVATION (DROP).",
)
@click.option("--max-readers", type=click.IntRange(0, 32767), default=None, help="MAX_QUEUE_READERS.")
@click.option("--procedure", default=None, help="PROCEDURE_NAME, as module:function.")
@click.option("--retention", type=click.Choice(["on", "off"], case_sensitive=False), default=None, help="RETENTION.")
@click.option(
    "--poison-message-handling",
    type=click.Choice(["on", "off"], case_sensitive=False),
    default=None,
    help="POISON_MESSAGE_HANDLING (STATUS).",
)
@cluster_options
@json_option
@handle_errors
def alter_cmd(queue, activation, max_readers, procedure, retention, poison_message_handling, target, as_json):
    """ALTER QUEUE ... WITH ACTIVATION (STATUS, MAX_QUEUE_READERS, PROCEDURE_NAME | DROP),
    RETENTION, POISON_MESSAGE_HANDLING."""
    options = (retention, poison_message_handling)
    if activation is None and max_readers is None and procedure is None and options == (None, None):
        fail(
            "nothing to alter: give --activation, --max-readers, --procedure, --retention or --poison-message-handling"
        )
    dropping = activation is not None and activation.lower() == "drop"
    if dropping and (max_readers is not None or procedure is not None):
        fail("--activation drop removes the activation: it takes no --max-readers or --procedure")
    if dropping or options != (None, None):
        from kbroker.kafka.queue_views import alter_queue

        q = alter_queue(
            target.cluster,
            target.namespace,
            queue,
            retention=retention.upper() if retention else None,
            poison_message_handling=poison_message_handling.upper() if poison_message_handling else None,
            drop_activation=dropping,
        )
        if dropping or (activation is None and max_readers is None and procedure is None):
            if as_json:
                emit_json({"queue": queue, **{k: q[k] for k in ("retention", "poison_message_handling", "activation")}})
            else:
                click.echo(
                    f"queue {queue}: retention {q['retention']}, poison_message_handling "
                    f"{q['poison_message_handling']}, activation {'none' if q['activation'] is None else 'kept'}"
                )
            return
    if procedure is not None and ":" in procedure and not _importable(procedure):  # the syntax: the model's
        fail(
            f"procedure {procedure!r}: module {procedure.partition(':')[0]!r} cannot be imported here "
            "(the worker imports it from the same installation)"
        )
    from kbroker.kafka.queue_views import alter_queue_activation

    result = alter_queue_activation(
        target.cluster,
        target.namespace,
        queue,
        status=activation.upper() if activation else None,
        max_queue_readers=max_readers,
        procedure=procedure,
    )
    if as_json:
        emit_json({"queue": queue, "activation": result})
    else:
        click.echo(
            f"queue {queue}: activation {result['status']}, max_queue_readers "
            f"{result['max_queue_readers']}, procedure {result['procedure']}"
        )


def _importable(procedure: str) -> bool:
    """Whether the module of 'module:function' can be found, without running it (its parent
    packages are imported to look inside them)."""
    import importlib.util

    module = procedure.partition(":")[0]
    try:
        return bool(module) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
