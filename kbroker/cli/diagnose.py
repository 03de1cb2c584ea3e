"""`kbroker diagnose`: Service Broker's ssbdiagnose for kbroker. CONFIGURATION checks everything a
dialog between two services needs; RUNTIME what stops messages in a namespace now
(core/diagnosis.py names each problem); END-TRANSACTION ends a hanging Kafka transaction that
RUNTIME named."""

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
@click.option(
    "--to-namespace",
    default=None,
    help="The target service's namespace (default: where this namespace's route for it leads).",
)
@click.option(
    "--to-bootstrap",
    default=None,
    help="The target namespace's cluster, when it is not this one (with --to-namespace).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.5),
    default=10.0,
    show_default=True,
    help="Seconds to wait for each cluster's answer.",
)
@cluster_options
@json_option
@handle_errors
def configuration_cmd(from_service, to_service, contract, to_namespace, to_bootstrap, timeout, target, as_json):
    """Check a dialog from FROM_SERVICE (in this namespace) to TO_SERVICE: both services, the
    contract and its message types on both sides, the queues, the routes both ways, the remote
    senders the target takes, and the far cluster answering. Exits 1 when a problem would stop the
    dialog (an error), 0 otherwise (warnings only)."""
    from kbroker.kafka.diagnosis import diagnose_configuration

    problems, where = diagnose_configuration(
        target.cluster,
        target.namespace,
        from_service,
        to_service,
        contract,
        to_cluster=to_bootstrap,
        to_namespace=to_namespace,
        timeout=timeout,
    )
    report(
        problems,
        as_json,
        where,
        f"dialog {from_service} ({where['from']}) -> {to_service} ({where['to'] or 'not found'}) on {contract}:",
    )


@diagnose_group.command("runtime")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.5),
    default=10.0,
    show_default=True,
    help="Seconds to wait for each answer.",
)
@click.option(
    "--stuck-after",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds after which an open Kafka transaction is hanging and a held group lock is named "
    "(default: 120, past any kbroker producer's transaction timeout).",
)
@click.option(
    "--conversation",
    default=None,
    metavar="HANDLE",
    help="One dialog only (an endpoint's handle or its conversation id): its endpoints' states and "
    "lifetimes, its services' queues, its routed messages not acknowledged.",
)
@cluster_options
@json_option
@handle_errors
def runtime_cmd(timeout, stuck_after, conversation, target, as_json):
    """What stops messages in this namespace now: disabled queues, ready messages no reader takes,
    conversation group locks held past --stuck-after, hanging Kafka transactions (with the command
    that ends each), routed messages the far side has not acknowledged (per destination, with the
    transmission status), an analytics job whose figures are old. Exits 1 when one of them is an
    error."""
    from kbroker.core.runtime_diagnosis import STUCK_AFTER_S
    from kbroker.kafka.diagnosis import diagnose_conversation, diagnose_runtime

    stuck_after = STUCK_AFTER_S if stuck_after is None else stuck_after
    if conversation is not None:
        problems, measured = diagnose_conversation(target.cluster, target.namespace, conversation, timeout, stuck_after)
        states = (
            ", ".join(
                f"{e['state_desc']} ({'initiator' if e['is_initiator'] else 'target'})" for e in measured["endpoints"]
            )
            or "no endpoint"
        )
        report(
            problems,
            as_json,
            {"namespace": target.namespace, "conversation": conversation, **measured},
            f"dialog {conversation} in {target.namespace}: {states}, "
            f"{len(measured['transmission'])} routed message(s) unacknowledged",
        )
        return
    problems, measured = diagnose_runtime(target.cluster, target.namespace, timeout, stuck_after)
    report(
        problems,
        as_json,
        {"namespace": target.namespace, **measured},
        f"namespace {target.namespace}: {len(measured['queues'])} queue(s), "
        f"{measured['transmission']} routed message(s) unacknowledged, "
        f"{len(measured['open_transactions'])} Kafka transaction(s) open",
    )


@diagnose_group.command("end-transaction")
@click.option("--topic", required=True, help="A topic of this namespace (as `diagnose runtime` names it).")
@click.option("--partition", type=click.IntRange(min=0), required=True)
@click.option(
    "--start-offset",
    type=click.IntRange(min=0),
    required=True,
    help="The open transaction's first offset (the partition's last stable offset).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=5),
    default=120.0,
    show_default=True,
    help="Seconds Kafka's tool may take (its first run also downloads it with Maven).",
)
@cluster_options
@json_option
@handle_errors
def end_transaction_cmd(topic, partition, start_offset, timeout, target, as_json):
    """Abort the hanging Kafka transaction whose first record is at START_OFFSET of TOPIC's
    PARTITION, with Kafka's own tool (`kafka-transactions.sh abort` with the same arguments; it
    needs the cluster's ClusterAction permission). The records behind it become readable; the
    transaction's own are dropped, as its producer never committed them."""
    from kbroker.core import names
    from kbroker.embedded.kafka_tools import TRANSACTIONS, run_tool
    from kbroker.errors import InvalidArgumentError

    if names.namespace_of(topic) != target.namespace:
        raise InvalidArgumentError(f"{topic} is not a topic of namespace {target.namespace}")
    output = run_tool(
        target.cluster,
        TRANSACTIONS,
        ["abort", "--topic", topic, "--partition", str(partition), "--start-offset", str(start_offset)],
        timeout,
        say=lambda msg: click.echo(msg, err=True),
    )
    if as_json:
        emit_json(
            {
                "topic": topic,
                "partition": partition,
                "start_offset": start_offset,
                "ended": True,
                "output": output.strip(),
            }
        )
    else:
        click.echo(
            f"ended the transaction at {topic} partition {partition} offset {start_offset}"
            + (f"\n{output.strip()}" if output.strip() else "")
        )


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
