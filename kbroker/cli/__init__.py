"""The `kbroker` command. Each sub-module adds the commands of one concept; this one holds the
shared conventions: `--bootstrap`/`--namespace` options, `--json` output, and one-line errors."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click
import orjson

from kbroker.errors import KBrokerError

bootstrap_option = click.option(
    "--bootstrap",
    envvar="KBROKER_BOOTSTRAP",
    default=None,
    help="Kafka bootstrap servers (default: KBROKER_BOOTSTRAP, else the embedded broker).",
)
namespace_option = click.option(
    "--namespace",
    envvar="KBROKER_NAMESPACE",
    default=None,
    help="Namespace (topic prefix and catalog); default KBROKER_NAMESPACE or 'default'.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def emit_json(obj: Any) -> None:
    """One JSON document per line on stdout."""
    sys.stdout.write(orjson.dumps(obj, default=str).decode() + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1) -> None:
    """A one-line error on stderr and a non-zero exit."""
    click.echo(f"kbroker: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn kbroker's typed errors (and bad values) into a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KBrokerError as exc:
            fail(str(exc))
        except (ValueError, FileNotFoundError) as exc:
            fail(str(exc))

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kbroker")
def main() -> None:
    """Service Broker semantics on Apache Kafka."""


def _register() -> None:
    # Sub-modules attach their commands to `main`; imported here so `kbroker --help` lists them.
    from kbroker.cli import activator, bench, broker, catalog, messaging, views, worker  # noqa: F401


_register()
