"""The sample conversation: an employee submits an expense claim, the expenses service approves
it, both sides end the dialog. Runs on the embedded broker unless a cluster is given."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kbroker import config
from kbroker.cli.output import make_console, new_table, print_table
from kbroker.core.catalog.loader import SAMPLES
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.embedded import resolve_cluster
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import BrokerUnavailableError, EmbeddedBrokerError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import END_DIALOG, Broker

if TYPE_CHECKING:
    from rich.table import Table

EMPLOYEES = "//Adventure-Works.com/Employees"
EXPENSES = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"


def run_demo(
    *,
    cluster: ClusterLike | None,
    namespace: str,
    data_dir: Path | None,
    port: int,
    keep_broker: bool,
    as_json: bool,
    analytics: bool = False,
) -> dict:
    console = make_console(stderr=as_json)
    say = console.print
    started: EmbeddedBroker | None = None
    try:
        cluster = resolve_cluster(cluster, data_dir)  # the broker rule; else the demo starts the embedded broker
    except BrokerUnavailableError:
        embedded = EmbeddedBroker(data_dir or config.default_data_dir(), progress=lambda m: say(f"[dim]broker:[/] {m}"))
        status = embedded.status()
        if not status.running:
            status = embedded.start(port=port)
            started = embedded
        if status.bootstrap is None:  # a running broker has an address; never None in practice
            raise EmbeddedBrokerError(f"the embedded broker in {status.data_dir} reports no address") from None
        cluster = Cluster(status.bootstrap)
    say(f"[bold]Kafka[/] at {cluster}, namespace [bold]{namespace}[/]")
    try:
        report = apply_paths(cluster, namespace, [SAMPLES])
        say(
            f"applied the expenses sample: {len(report.topics_created)} topic(s) created, "
            f"{report.objects_published} catalog object(s) published"
        )
        steps = _conversation(Broker(cluster, namespace), say, lambda table: print_table(table, console))
        if analytics:
            from kbroker.cli.demo_analytics import run_analytics_demo

            steps.append(
                {"analytics": run_analytics_demo(cluster, namespace, say, lambda table: print_table(table, console))}
            )
    finally:
        if started is not None and not keep_broker:
            started.stop()
            say("[dim]embedded broker stopped (use --keep-broker to leave it running)[/]")
    result = {"bootstrap": cluster.bootstrap, "namespace": namespace, "steps": steps}
    if as_json:
        from kbroker.cli.common import emit_json

        emit_json(result)
    return result


def _conversation(broker: Broker, say: Callable[[str], None], show: Callable[[Table], None]) -> list[dict]:
    steps: list[dict] = []

    def step(who: str, what: str, msg=None) -> None:
        steps.append({"who": who, "what": what, **({"message": msg.as_dict()} if msg else {})})
        say(f"[cyan]{who:>9}[/] {what}")

    with broker:
        handle = broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT)
        step("employee", f"BEGIN DIALOG {handle}")
        broker.send(handle, CLAIM, {"employee": "jdoe", "amount": 42.50, "item": "train ticket"})
        step("employee", "SEND ExpenseClaim")

        # Each side's own conversation group names this dialog on that side's queue.
        employee = broker.endpoints.get(handle)
        group, target_group = employee.conversation_group_id, employee.far_conversation_group_id
        claim = _receive_one(broker, "ExpenseQueue", target_group)
        step("expenses", f"RECEIVE {claim.message_type_name.rsplit('/', 1)[-1]} {claim.text}", claim)
        broker.send(claim.conversation_handle, APPROVAL, {"approved": True, "by": "expenses"})
        step("expenses", "SEND ExpenseApproval")

        approval = _receive_one(broker, "EmployeeQueue", group)
        step("employee", f"RECEIVE {approval.message_type_name.rsplit('/', 1)[-1]} {approval.text}", approval)
        broker.end_conversation(handle)
        step("employee", "END CONVERSATION")

        end = _receive_one(broker, "ExpenseQueue", target_group)
        if end.message_type_name != END_DIALOG:
            raise RuntimeError(f"expected EndDialog, received {end.message_type_name}")
        step("expenses", "RECEIVE EndDialog")
        broker.end_conversation(claim.conversation_handle)
        step("expenses", "END CONVERSATION")
        # That END acknowledges the employee's: its next RECEIVE consumes the acknowledgement
        # without returning it, and the employee's endpoint goes from DO to CD.
        broker.receive("EmployeeQueue", top=1, wait=5, conversation_group=group)
        step("employee", "RECEIVE (end acknowledged, nothing returned)")

        table = new_table("conversation endpoints", "side", "service", "state", "conversation_handle")
        for h in (handle, claim.conversation_handle):
            ep = broker.endpoints.get(h)
            table.add_row(ep.side, ep.service_name, f"{ep.state} {ep.state_desc}", h)
            steps.append({"endpoint": h, "side": ep.side, "state": ep.state})
        show(table)
    return steps


def _receive_one(broker: Broker, queue: str, group: str):
    """RECEIVE TOP(1) WHERE conversation_group_id = group, waiting up to 30 s: earlier demo runs
    may have left other conversations on the sample queues."""
    msgs = broker.receive(queue, top=1, wait=30, conversation_group=group)
    if not msgs:
        raise RuntimeError(f"nothing arrived on {queue} within 30 s")
    return msgs[0]
