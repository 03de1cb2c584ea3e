"""`kbroker broker ...`: the embedded Apache Kafka broker (start, stop, status, fetch)."""

from __future__ import annotations

from pathlib import Path

import click

from kbroker import config
from kbroker.cli import emit_json, handle_errors, json_option, main

data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the broker's data, config and log (default: KBROKER_DATA_DIR, "
    "else ~/.local/share/kbroker/broker).",
)


def _embedded(data_dir: Path | None, quiet: bool = False):
    # Imported here so `kbroker --help` stays fast.
    from kbroker.embedded.broker import EmbeddedBroker

    progress = None if quiet else (lambda msg: click.echo(msg, err=True))
    return EmbeddedBroker(data_dir or config.default_data_dir(), progress=progress)


@main.group()
def broker() -> None:
    """The embedded Apache Kafka broker (one KRaft node on 127.0.0.1)."""


@broker.command()
@data_dir_option
@click.option("--port", type=click.IntRange(1, 65535), default=9092, show_default=True,
              help="Port of the PLAINTEXT listener clients connect to.")
@click.option("--controller-port", type=click.IntRange(1, 65535), default=None,
              help="Port of the KRaft controller listener (default: port+1 if free, else any).")
@click.option("--wait", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the broker to answer.")
@json_option
@handle_errors
def start(data_dir: Path | None, port: int, controller_port: int | None, wait: float,
          as_json: bool) -> None:
    """Start the broker (no-op if it already runs) and print its bootstrap address."""
    status = _embedded(data_dir).start(port=port, controller_port=controller_port, wait=wait)
    if as_json:
        emit_json(status.as_dict())
    else:
        click.echo(status.bootstrap)


@broker.command()
@data_dir_option
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for a clean shutdown before killing the JVM.")
@json_option
@handle_errors
def stop(data_dir: Path | None, timeout: float, as_json: bool) -> None:
    """Stop the broker cleanly."""
    embedded = _embedded(data_dir)
    was_running = embedded.stop(timeout=timeout)
    if as_json:
        emit_json({"stopped": was_running, **embedded.status().as_dict()})
    else:
        click.echo("stopped" if was_running else "not running")


@broker.command()
@data_dir_option
@json_option
@handle_errors
def status(data_dir: Path | None, as_json: bool) -> None:
    """Show whether the broker runs (exit status 0 either way)."""
    st = _embedded(data_dir, quiet=True).status()
    if as_json:
        emit_json(st.as_dict())
    elif st.running:
        click.echo(f"running at {st.bootstrap} (pid {st.pid}, Apache Kafka {st.version}, "
                   f"data dir {st.data_dir})")
    else:
        click.echo(f"not running (data dir {st.data_dir})")


@broker.command()
@handle_errors
def fetch() -> None:
    """Download the Apache Kafka jars into the cache (done by `start` when needed)."""
    click.echo(str(_embedded(None).fetch()))
