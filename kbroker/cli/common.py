"""What every `kbroker` command shares: the command group, the `--bootstrap`/`--namespace`/`--json`
options, JSON output, one-line errors, and the check for an optional extra. The command modules
import it; `kbroker.cli` imports them, so no command module imports `kbroker.cli` itself."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, TypeVar, cast

import click
import orjson

from kbroker import config
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.errors import BrokerUnavailableError, KBrokerError, PermissionDeniedError

_bootstrap_option = click.option(
    "--bootstrap",
    envvar="KBROKER_BOOTSTRAP",
    default=None,
    help="Kafka bootstrap servers (default: KBROKER_BOOTSTRAP, else the embedded broker).",
)
_command_config_option = click.option(
    "--command-config",
    envvar="KBROKER_COMMAND_CONFIG",
    default=None,
    type=click.Path(dir_okay=False),
    help="Kafka client properties file (security.protocol, sasl.*, ssl.*; Java or librdkafka names), "
    "as Kafka's tools read it. Default: KBROKER_COMMAND_CONFIG. KBROKER_KAFKA_* variables add to it.",
)
_namespace_option = click.option(
    "--namespace",
    envvar="KBROKER_NAMESPACE",
    default=None,
    help="Namespace (topic prefix and catalog); default KBROKER_NAMESPACE or 'default'.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
# The worker's HTTP API token: from a file (a Docker or Kubernetes secret) or KBROKER_WEB_TOKEN,
# never a command-line value, which every process listing would show.
web_token_file_option = click.option(
    "--web-token-file",
    type=click.Path(dir_okay=False),
    envvar="KBROKER_WEB_TOKEN_FILE",
    default=None,
    help="File whose first line is the token of the workers' HTTP API (else env KBROKER_WEB_TOKEN); "
    "env KBROKER_WEB_TOKEN_FILE.",
)

# The worker's HTTP port, one option and one variable for the worker that serves it and the
# commands that ask it (`tasks`, `conversations`), so a worker on another port is found by both.
WEB_PORT = 6066
web_port_option = click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    envvar="KBROKER_WEB_PORT",
    default=WEB_PORT,
    show_default=True,
    help="Port of the worker's HTTP API (/monitors/, /tasks/); env KBROKER_WEB_PORT.",
)


def web_urls(urls: tuple[str, ...] | str | None, web_port: int) -> list[str]:
    """The workers' HTTP APIs to ask: those named by --url, else this host's at --web-port."""
    named = [urls] if isinstance(urls, str) else list(urls or ())
    return named or [f"http://127.0.0.1:{web_port}"]


# Long-running processes other than the worker (whose /metrics is on its web server) serve their
# Prometheus metrics only when asked: an application may run its own exporter.
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    envvar="KBROKER_METRICS_PORT",
    default=None,
    help="Serve this process's Prometheus metrics at http://HOST:PORT/metrics (HOST: env "
    "KBROKER_METRICS_HOST, 127.0.0.1 by default); env KBROKER_METRICS_PORT.",
)


log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="KBROKER_LOG_FORMAT",
    default="text",
    show_default=True,
    help="json: one JSON object a line (time, level, logger, message, namespace and "
    "the queue or conversation a line is about); env KBROKER_LOG_FORMAT.",
)


def setup_logging(loglevel: str, log_format: str, **fixed: Any) -> None:
    """The root logger at `loglevel`, as text or JSON lines (core/json_logs.py) with `fixed` fields."""
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if log_format == "json":
        from kbroker.core.json_logs import use_json_logs

        use_json_logs(**fixed)


def serve_metrics(port: int | None) -> Any:
    """The --metrics-port server (sdk/metrics.py), or None when not asked for."""
    if port is None:
        return None
    from kbroker.sdk.metrics import MetricsServer

    return MetricsServer(port, host=os.environ.get("KBROKER_METRICS_HOST", "127.0.0.1"))


def emit_json(obj: Any) -> None:
    """One JSON document per line on stdout."""
    sys.stdout.write(orjson.dumps(obj, default=str).decode() + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """A one-line error on stderr and a non-zero exit."""
    click.echo(f"kbroker: error: {message}", err=True)
    sys.exit(code)


# The packages of the optional extras (pyproject.toml), by the extra that installs them.
EXTRA_OF_PACKAGE = {"faust": "worker", "aiokafka": "worker", "pyspark": "analytics"}


def missing_extra(package: str, extra: str | None = None) -> str:
    """The one line telling which extra installs a missing package."""
    extra = extra or EXTRA_OF_PACKAGE[package]
    return f"{package} is not installed: this command needs kbroker's {extra} extra (pip install 'kbroker[{extra}]')"


def require_extra(extra: str, *packages: str) -> None:
    """Fail with one line naming the extra unless all packages are installed (nothing is imported)."""
    for package in packages:
        if importlib.util.find_spec(package) is None:
            fail(missing_extra(package, extra))


def error_line(exc: ValueError) -> str:
    """A bad value as one line: pydantic's ValidationError (several lines and a link) becomes
    "field: reason"."""
    if type(exc).__module__.startswith("pydantic"):  # checked by name: pydantic is not loaded at start
        from pydantic import ValidationError

        from kbroker.core.catalog.loader import pydantic_reason

        if isinstance(exc, ValidationError):
            return pydantic_reason(exc)
    return str(exc)


F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Turn kbroker's typed errors, bad values and a missing optional extra into a one-line message
    and exit code 1. A refusal by the cluster's authorizer names the principal, the operation
    and the resource (the principal from the command's client settings when the code that met
    the refusal did not know it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PermissionDeniedError as exc:
            fail(exc.naming(_principal(kwargs.get("target"))).line())
        except BrokerUnavailableError as exc:
            fail(str(_explained(exc, kwargs.get("target"))))
        except KBrokerError as exc:
            fail(str(exc))
        except ValueError as exc:  # pydantic's ValidationError included
            fail(error_line(exc))
        except FileNotFoundError as exc:
            fail(str(exc))
        except ModuleNotFoundError as exc:
            package = (exc.name or "").partition(".")[0]
            if package not in EXTRA_OF_PACKAGE:
                raise
            fail(missing_extra(package))

    return cast(F, wrapper)


def _explained(exc: BrokerUnavailableError, target: Any) -> KBrokerError:
    """A broker that cannot be reached, or the reason a listening one would not serve the command
    (a wrong password, a TLS listener met in plaintext): librdkafka reports both as a transport
    failure or a time-out."""
    if not isinstance(target, Target):
        return exc
    from kbroker.kafka.clients import refusal

    try:
        return refusal(target.cluster) or exc
    except KBrokerError:
        return exc


def _principal(target: Any) -> str | None:
    """Who the command's cluster takes it for (a refusal names them), when it has a cluster."""
    if not isinstance(target, Target):
        return None
    from kbroker.kafka.clients import principal

    try:
        return principal(target.cluster) or None
    except KBrokerError:
        return None


@dataclass(frozen=True)
class Target:
    """The Kafka cluster and namespace a command works on, from its `--bootstrap` and `--namespace`
    (or KBROKER_BOOTSTRAP / KBROKER_NAMESPACE). `cluster` follows the broker rule
    (kbroker.embedded.resolve_cluster) when a command first reads it, as the command ran it before:
    a command that fails on its own options, or needs no broker (`endpoint acls`, `conversations`
    answered by a worker), never looks for one."""

    given: str | None = None  # --bootstrap as given
    namespace_given: str | None = None  # --namespace as given
    command_config: str | None = None  # --command-config as given

    @property
    def explicit(self) -> Cluster | None:
        """The cluster the command was given, with the client properties, if any (no embedded
        broker looked for)."""
        from kbroker.embedded import resolve_cluster

        return resolve_cluster(self.given, command_config=self.command_config) if self.given else None

    @functools.cached_property
    def cluster(self) -> Cluster:
        """The broker rule's cluster; BrokerUnavailableError when nothing is configured or running."""
        return self.cluster_or(None)

    def cluster_or(self, fallback: ClusterLike | None) -> Cluster:
        """The broker rule with `fallback` (a config file's cluster) after the given one."""
        from kbroker.embedded import resolve_cluster

        return resolve_cluster(self.given or fallback, command_config=self.command_config)

    @property
    def namespace(self) -> str:
        return config.namespace(self.namespace_given)


def _target_options(fn: Callable[..., Any], with_namespace: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(
        *args: Any, bootstrap: str | None, command_config: str | None, namespace: str | None = None, **kwargs: Any
    ) -> Any:
        return fn(*args, target=Target(bootstrap, namespace, command_config), **kwargs)

    return _bootstrap_option(_command_config_option(_namespace_option(wrapper) if with_namespace else wrapper))


def cluster_options(fn: F) -> F:
    """`--bootstrap` and `--namespace` (declared here once): the command gets them as
    `target: Target` (its `cluster` and `namespace`)."""
    return cast(F, _target_options(fn, with_namespace=True))


def cluster_option(fn: F) -> F:
    """`--bootstrap` alone, for a command with no namespace (`bench`): it gets `target: Target`."""
    return cast(F, _target_options(fn, with_namespace=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kbroker")
def main() -> None:
    """Service Broker semantics on Apache Kafka."""
