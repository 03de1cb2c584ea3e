"""`kbroker analytics run|fetch` (the Spark Structured Streaming job, docs/analytics.md) and
`kbroker dialogs` (dialogs by class, from the analytics topic)."""

from __future__ import annotations

from pathlib import Path

import click

from kbroker import config
from kbroker.cli.common import (
    cluster_options,
    emit_json,
    fail,
    handle_errors,
    json_option,
    log_format_option,
    main,
    metrics_port_option,
    require_extra,
    serve_metrics,
    setup_logging,
)
from kbroker.cli.output import new_table, print_table


@main.group()
def analytics() -> None:
    """Spark Structured Streaming beside the broker: stale-message analytics per queue and window,
    dialog reclassification, and Parquet history (docs/analytics.md)."""


@analytics.command("fetch")
@json_option
@handle_errors
def fetch_cmd(as_json):
    """Resolve Spark's Kafka source (spark-sql-kafka-0-10, at the installed pyspark's version)
    with Maven into kbroker's cache; `run` does this on its first start."""
    require_extra("analytics", "pyspark")
    from kbroker.analytics.connector import connector_jars

    jars = connector_jars(lambda msg: click.echo(msg, err=True))
    if as_json:
        emit_json({"jars": [str(j) for j in jars]})
    else:
        for jar in jars:
            click.echo(str(jar))


@analytics.command("run")
@cluster_options
@click.option(
    "--master",
    envvar="SPARK_MASTER",
    default="local[*]",
    show_default=True,
    help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...); env SPARK_MASTER.",
)
@click.option(
    "--checkpoint",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoint directory (default: <cache>/analytics/<namespace>/checkpoint).",
)
@click.option(
    "--history",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Parquet history directory (default: <cache>/analytics/<namespace>/history).",
)
@click.option(
    "--trigger", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds between micro-batches."
)
@click.option(
    "--window", type=click.FloatRange(min=1), default=60.0, show_default=True, help="Seconds per analytics window."
)
@click.option(
    "--stale-after",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds after which an unreceived message is stale, for queues without their own stale_after.",
)
@click.option(
    "--top",
    type=click.IntRange(0, 100),
    default=5,
    show_default=True,
    help="Conversation groups listed per window as holding the backlog.",
)
@click.option(
    "--max-per-batch",
    type=click.IntRange(min=100),
    default=20000,
    show_default=True,
    help="At most this many records per micro-batch (back-pressure).",
)
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting (repeatable), e.g. --conf spark.driver.memory=2g.",
)
@click.option("--loglevel", default="info", show_default=True)
@log_format_option
@metrics_port_option
@handle_errors
def run_cmd(
    target,
    master,
    checkpoint,
    history,
    trigger,
    window,
    stale_after,
    top,
    max_per_batch,
    confs,
    loglevel,
    log_format,
    metrics_port,
):
    """Run the analytics job until interrupted: reads the namespace's queue, progress, timer and
    dead-letter topics, writes queue windows and dialog classes to the analytics topic,
    RECLASSIFY commands to the control topic, and closed windows to Parquet."""
    require_extra("analytics", "pyspark")
    from kbroker.analytics.job import JobSettings, run_forever

    spark_conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--conf {item!r} must be KEY=VALUE")
        spark_conf[key.strip()] = value
    ns = target.namespace
    home = config.cache_dir() / "analytics" / ns
    setup_logging(loglevel, log_format, namespace=ns)
    serve_metrics(metrics_port)  # serves until the process ends
    run_forever(
        JobSettings(
            cluster=target.cluster,
            namespace=ns,
            master=master,
            checkpoint=checkpoint or home / "checkpoint",
            history=history or home / "history",
            trigger=trigger,
            window=window,
            stale_after=stale_after,
            top=top,
            max_per_batch=max_per_batch,
            spark_conf=spark_conf,
        )
    )


@main.command("dialogs")
@cluster_options
@click.option(
    "--class",
    "klass",
    default=None,
    metavar="CLASS",
    help="Only dialogs of this class (erroring, stale, backlogged, active, timer_pending, idle).",
)
@json_option
@handle_errors
def dialogs_cmd(target, klass, as_json):
    """Dialogs by class, as the analytics job last classified them (the analytics topic)."""
    from kbroker.core.analytics.dialog_class import CLASSES
    from kbroker.kafka.analytics.store import dialog_rows

    if klass is not None and klass not in CLASSES:
        fail(f"--class {klass!r} is not a class; one of {', '.join(CLASSES)}")
    rows = dialog_rows(target.cluster, target.namespace, klass)
    if as_json:
        emit_json(rows)
        return
    table = new_table(
        f"dialogs{'' if klass is None else ' of class ' + klass}",
        "conversation_id",
        "side",
        "queue",
        "class",
        "backlog",
        "oldest_age_s",
        "reason",
    )
    for r in rows:
        table.add_row(
            r["conversation_id"],
            r["side"],
            r["queue"],
            r["class"],
            str(r["backlog"]),
            "" if r["oldest_age_s"] is None else f"{r['oldest_age_s']:.1f}",
            r["reason"],
        )
    print_table(table)
