"""`kbroker apply PATH...`, `kbroker drop KIND NAME` and `kbroker catalog show`: the catalog from
YAML to Kafka and back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kbroker.cli.common import (
    cluster_options,
    emit_json,
    handle_errors,
    json_option,
    main,
)
from kbroker.cli.output import make_console, new_table, print_table

# core/catalog/drops.DROP_KINDS, spelt out: `kbroker --help` loads no pydantic (test_catalog_drop checks)
DROP_CHOICES = [
    "message-type",
    "contract",
    "queue",
    "service",
    "route",
    "xml-schema-collection",
    "broker-priority",
    "remote-service-binding",
]

if TYPE_CHECKING:
    from rich.table import Table

    from kbroker.core.catalog.models import Catalog


@main.command("apply")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--samples", is_flag=True, help="Apply the expenses sample that ships with kbroker (beside any PATHS).")
@cluster_options
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas of the topics this apply creates (default: as many as the cluster "
    "has brokers, up to 3; 2 must be in sync when there are 3). Existing topics keep theirs.",
)
@json_option
@handle_errors
def apply_cmd(paths, samples, target, replication_factor, as_json):
    """Validate the definitions in PATHS (files or directories of *.yaml) and apply them:
    create or update the topics, then publish the catalog. An invalid definition applies nothing.
    --samples applies the expenses sample shipped with kbroker."""
    from kbroker.core.catalog.loader import SAMPLES, load_definitions
    from kbroker.kafka.catalog.apply import apply_catalog
    from kbroker.sdk.catalog_drop import drop

    if not paths and not samples:
        raise click.UsageError("name the definitions to apply (PATHS), or --samples")
    paths = [*paths, SAMPLES] if samples else list(paths)
    ns = target.namespace
    # Validate before looking for a broker: a bad file is reported even when none runs.
    catalog = load_definitions(paths, ns)
    err = make_console(stderr=True)
    progress = None if as_json else (lambda msg: err.print(f"[dim]{msg}[/dim]"))
    report = apply_catalog(
        target.cluster,
        catalog,
        progress,
        replication_factor=replication_factor,
        dropper=lambda kind, name: drop(target.cluster, ns, kind, name),  # DROP SERVICE ends its dialogs
    )
    if as_json:
        emit_json(report.as_dict())
        return
    for line in report.dropped:
        click.echo(f"dropped {line}")
    if not (report.topics_created or report.topics_updated or report.objects_published or report.dropped):
        click.echo(f"namespace {ns}: nothing to change")
        return
    table = new_table(f"namespace {ns}", "topic", "change")
    for topic in report.topics_created:
        table.add_row(topic, "created")
    retention: dict[str, list[str]] = {}
    for line in report.retention_changed:  # "topic: retention.ms 604800000 -> -1"
        topic, change = line.split(": ", 1)
        retention.setdefault(topic, []).append(change)
    for topic in report.topics_updated:
        table.add_row(topic, "; ".join(["updated", *retention.get(topic, [])]))
    console = make_console()
    if table.row_count:
        print_table(table, console)
    console.print(f"published {report.objects_published} catalog records")


@main.command("drop")
@click.argument(
    "kind",
    type=click.Choice(DROP_CHOICES),
)
@click.argument("name")
@click.option(
    "--delete-topics",
    is_flag=True,
    help="DROP QUEUE: delete the queue's topics too (cannot be undone; by default they are kept).",
)
@cluster_options
@json_option
@handle_errors
def drop_cmd(kind, name, delete_topics, target, as_json):
    """DROP KIND NAME: remove one object from the namespace's catalog. Refused while another
    object uses it (a contract its message type, a service its contract or queue, a message type
    its XML schema collection) and for the built-ins. DROP SERVICE ends the service's open
    dialogs with Error -8470 to the far side and closes their endpoints here."""
    from kbroker.sdk.catalog_drop import drop

    report = drop(target.cluster, target.namespace, kind, name, delete_topics=delete_topics)
    if as_json:
        emit_json(report.as_dict())
        return
    click.echo(f"namespace {report.namespace}: dropped {kind} {name}")
    if report.dialogs_ended:
        click.echo(f"ended {len(report.dialogs_ended)} open dialogs with error -8470")
    for topic in report.topics_deleted:
        click.echo(f"deleted topic {topic}")
    for topic in report.topics_kept:
        click.echo(f"kept topic {topic} (--delete-topics deletes it)")


@main.group("catalog")
def catalog_group():
    """Inspect the catalog published in Kafka."""


@catalog_group.command("show")
@cluster_options
@json_option
@handle_errors
def show_cmd(target, as_json):
    """List the objects of the namespace's catalog (built-ins included)."""
    from kbroker.kafka.catalog.catalog_store import read_catalog

    catalog = read_catalog(target.cluster, target.namespace)
    if as_json:
        emit_json(catalog.model_dump(mode="json"))
        return
    console = make_console()
    for table in _tables(catalog):
        if table.row_count:
            print_table(table, console)


def _tables(c: Catalog) -> list[Table]:
    """One table per kind of catalog object (long names wrap on a terminal, never truncate)."""
    mt = new_table("message types", "name", "validation")
    for m in c.message_types.values():
        mt.add_row(
            m.name, m.validation + (f" WITH SCHEMA COLLECTION {m.schema_collection}" if m.schema_collection else "")
        )
    ct = new_table("contracts", "name", "messages")
    for k in c.contracts.values():
        ct.add_row(k.name, "\n".join(f"{m.type} ({m.sent_by})" for m in k.messages))
    qt = new_table("queues", "name", "partitions", "status", "retention", "activation")
    for q in c.queues.values():
        a = q.activation
        act = f"{a.status} {a.kind} {a.procedure or ''} x{a.max_queue_readers}".replace("  ", " ") if a else "-"
        qt.add_row(q.name, str(q.partitions), q.status, q.retention, act)
    st = new_table("services", "name", "queue", "contracts", "owner")
    for s in c.services.values():
        st.add_row(s.name, s.queue, "\n".join(s.contracts) or "-", s.owner)
    rt = new_table("routes", "name", "service", "address", "lifetime")
    for r in c.routes.values():
        rt.add_row(r.name, r.service_name or "*", r.address, str(r.lifetime or "-"))
    bt = new_table("remote service bindings", "name", "to service", "user", "anonymous")
    for b in c.remote_service_bindings.values():
        bt.add_row(b.name, b.to_service, b.user, "ON" if b.anonymous else "OFF")
    return [mt, ct, qt, st, rt, bt]
