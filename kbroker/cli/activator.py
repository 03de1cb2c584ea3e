"""`kbroker activator run|check`: the external activator (kbroker/activator), SSB's EAService."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from kbroker import config
from kbroker.cli.common import (
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    log_format_option,
    main,
    metrics_port_option,
    serve_metrics,
    setup_logging,
)

config_option = click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The activator's YAML config file (see docs/activator.md).",
)


def _app_row(app) -> dict:
    return {
        "name": app.label,
        "queue": app.queue,
        "command": app.command,
        "min_concurrency": app.min_concurrency,
        "max_concurrency": app.max_concurrency,
        "env": dict(app.env),
        "cwd": app.cwd,
        "enabled": app.enabled,
    }


def _text_line(record: dict) -> str:
    # One line per record, `key=value` after the time and event: greppable, and the same fields
    # as the JSON form.
    rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("time", "event", "namespace"))
    return f"{record['time']} {record['event']} {rest}".rstrip()


@main.group("activator")
def activator_group():
    """External activator: start programs when a queue's QUEUE_ACTIVATION event arrives."""


@activator_group.command("check")
@config_option
@json_option
@handle_errors
def check_cmd(config_file, as_json):
    """Validate the config file and list its applications."""
    from kbroker.activator.config import load_config

    cfg = load_config(config_file)
    rows = [_app_row(a) for a in cfg.applications]
    if as_json:
        emit_json(
            {
                "config": str(config_file),
                "namespace": cfg.namespace,
                "bootstrap": cfg.bootstrap,
                "shutdown_grace": cfg.shutdown_grace,
                "stale_after": cfg.stale_after,
                "restart_delay": cfg.restart_delay,
                "applications": rows,
            }
        )
        return
    click.echo(f"{config_file}: {len(rows)} application(s)")
    for r in rows:
        state = "" if r["enabled"] else " (disabled)"
        click.echo(
            f"  {r['name']}{state}: queue {r['queue']}, {r['min_concurrency']}..{r['max_concurrency']} "
            f"copies of {' '.join(r['command'])}"
        )


@activator_group.command("run")
@config_option
@cluster_options
@json_option
@log_format_option
@metrics_port_option
@handle_errors
def run_cmd(config_file, target, as_json, log_format, metrics_port):
    """Run until SIGTERM or SIGINT, starting the configured programs on QUEUE_ACTIVATION events.

    Logs one line per start, exit and notification on stdout (--json: one JSON object per line);
    the programs' own stdout goes to stderr. On SIGTERM/SIGINT the programs get SIGTERM, then
    SIGKILL after the config's shutdown_grace."""
    from kbroker.activator.config import load_config
    from kbroker.activator.runner import Activator

    cfg = load_config(config_file)
    # --bootstrap / KBROKER_BOOTSTRAP, then the file, then the embedded broker (same for namespace).
    cluster = target.cluster_or(cfg.bootstrap)
    ns = config.namespace(target.namespace_given or cfg.namespace)
    if log_format == "json":  # its event lines as JSON (as --json), and the libraries' warnings too
        as_json = True
        setup_logging("warning", log_format, namespace=ns)

    def log(record: dict) -> None:
        if as_json:
            emit_json(record)
        else:
            sys.stdout.write(_text_line(record) + "\n")
            sys.stdout.flush()

    activator = Activator(cfg, cluster, ns, log=log)
    serve_metrics(metrics_port)  # serves until the process ends
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: activator.stop())
    activator.run()
