"""`kbroker diagnose`: Service Broker's ssbdiagnose for kbroker. CONFIGURATION checks everything a
dialog between two services needs; RUNTIME what stops messages in a namespace now
(core/diagnosis.py names each problem)."""

from __future__ import annotations

import sys
from typing import Any

import click

from kbroker.cli.common import cluster_options, emit_json, handle_errors, json_option, main


@main.group("diagnose")
def diagnose_group() -> None:
    """Why a dialog cannot work, as ssbdiagnose says it."""


@diagnose_group.command("configuration")
@click.argument("from_service")
@click.argument("to_service")
@click.option("--contract", default="DEFAULT", show_default=True, help="The dialog's contract.")
@click.option("--to-namespace", default=None,
              help="The target service's namespace (default: where this namespace's route for it leads).")
@click.option("--to-bootstrap", default=None,
              help="The target namespace's cluster, when it is not this one (with --to-namespace).")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="Seconds to wait for each cluster's answer.")
@cluster_options
@json_option
@handle_errors
def configuration_cmd(from_service, to_service, contract, to_namespace, to_bootstrap, timeout, target, as_json):
    """Check a dialog from FROM_SERVICE (in this namespace) to TO_SERVICE: both services, the
    contract and its message types on both sides, the queues, the routes both ways, the remote
    senders the target takes, and the far cluster answering. Exits 1 when a problem would stop the
    dialog (an error), 0 otherwise (warnings only)."""
    from kbroker.kafka.diagnosis import diagnose_configuration

    problems, where = diagnose_configuration(target.cluster, target.namespace, from_service, to_service, contract,
                                             to_cluster=to_bootstrap, to_namespace=to_namespace, timeout=timeout)
    report(problems, as_json, where, f"dialog {from_service} ({where['from']}) -> {to_service} "
                                     f"({where['to'] or 'not found'}) on {contract}:")


@diagnose_group.command("runtime")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="Seconds to wait for each answer.")
@cluster_options
@json_option
@handle_errors
def runtime_cmd(timeout, target, as_json):
    """What stops messages in this namespace now: disabled queues, ready messages no reader takes,
    routed messages the far side has not acknowledged (per destination, with the transmission
    status), an analytics job whose figures are old. Exits 1 when one of them is an error."""
    from kbroker.kafka.diagnosis import diagnose_runtime

    problems, measured = diagnose_runtime(target.cluster, target.namespace, timeout)
    report(problems, as_json, {"namespace": target.namespace, **measured},
           f"namespace {target.namespace}: {len(measured['queues'])} queue(s), "
           f"{measured['transmission']} routed message(s) unacknowledged")


def report(problems: list[Any], as_json: bool, facts: dict[str, Any], heading: str) -> None:
    """The problems as JSON (with `facts`) or as lines under `heading`; exit 1 when one is an error."""
    from kbroker.core.diagnosis import ERROR, describe

    if as_json:
        emit_json({**facts, "problems": [p.as_dict() for p in problems]})
    else:
        click.echo(heading)
        click.echo(describe(problems))
    if any(p.severity == ERROR for p in problems):
        sys.exit(1)
