"""`kbroker grant|deny|revoke` and `kbroker permissions`: Service Broker's permissions, written as
T-SQL writes them, applied as the Kafka ACLs that enforce them (core/security/permissions.py), by a
principal that may alter the cluster's ACLs.

    kbroker grant SEND ON SERVICE::orders TO User:alice
    kbroker grant RECEIVE, ALTER ON QUEUE::OrderQueue TO User:worker
    kbroker grant CONTROL ON CATALOG::sales TO User:ops        # the catalog's owner
    kbroker deny SEND ON SERVICE::orders TO User:mallory
    kbroker revoke SEND ON SERVICE::orders FROM User:alice
    kbroker permissions --principal User:alice
"""

from __future__ import annotations

import click

from kbroker.cli.common import cluster_options, emit_json, handle_errors, json_option, main
from kbroker.cli.output import new_table, print_table

_WORDS = click.argument("statement", nargs=-1, required=True)
_DRY_RUN = click.option("--dry-run", is_flag=True, help="Print the ACLs, change nothing.")


def _run(state: str, statement: tuple[str, ...], dry_run: bool, target, as_json: bool) -> None:
    from kbroker.core.security.permissions import parse
    from kbroker.kafka.security import permissions

    perms = parse(state if state != "REVOKE" else "GRANT", statement, target.namespace)
    change = (permissions.revoke if state == "REVOKE" else permissions.grant)(
        target.cluster, target.namespace, perms, dry_run=dry_run
    )
    if as_json:
        emit_json({**change.as_dict(), "dry_run": dry_run})
        return
    verb = {"GRANT": "granted", "DENY": "denied", "REVOKE": "revoked"}[state]
    what = ", ".join(f"{p.action} ON {p.cls}::{p.name}" for p in perms)
    click.echo(
        f"{'would have ' if dry_run else ''}{verb} {what} {'from' if state == 'REVOKE' else 'to'} "
        f"{perms[0].principal}: {len(change.acls)} ACL(s) {'deleted' if state == 'REVOKE' else 'held'}"
    )
    for p in change.also_lost:
        click.echo(f"  also lost (it shares those ACLs): {p.action} ON {p.cls}::{p.name}")


def _statement_command(state: str, doc: str) -> None:
    """`kbroker grant|deny|revoke STATEMENT...`: one command per state, the same options."""

    @main.command(state.lower(), help=doc)
    @_WORDS
    @_DRY_RUN
    @cluster_options
    @json_option
    @handle_errors
    def command(statement, dry_run, target, as_json):
        _run(state, statement, dry_run, target, as_json)


_statement_command(
    "GRANT",
    "GRANT PERMISSION[, ...] ON CLASS::name TO principal (SEND ON SERVICE, RECEIVE / "
    "ALTER / CONTROL ON QUEUE, ALTER / CONTROL ON SERVICE, CONTROL ON CATALOG): creates its ACLs.",
)
_statement_command("DENY", "DENY PERMISSION ON CLASS::name TO principal: Kafka DENY ACLs, which win over any grant.")
_statement_command(
    "REVOKE", "REVOKE PERMISSION ON CLASS::name FROM principal: deletes its grant's and its deny's ACLs."
)


@main.command("permissions")
@click.option("--principal", default=None, help="Only this principal's (default: every principal's).")
@cluster_options
@json_option
@handle_errors
def permissions_cmd(principal, target, as_json):
    """The permissions in the namespace, read back from the cluster's ACLs (what the authorizer
    enforces); ACLs that make no permission are listed as they are."""
    from kbroker.kafka.security.permissions import listed

    shown, raw = listed(target.cluster, target.namespace, principal)
    if as_json:
        emit_json({"permissions": [p.as_dict() for p in shown], "other_acls": [b.as_dict() for b in raw]})
        return
    t = new_table(f"permissions in namespace {target.namespace}", "principal", "state", "permission", "on")
    for p in shown:
        t.add_row(p.principal, p.state, p.action, f"{p.cls}::{p.name}")
    print_table(t)
    if raw:
        t = new_table("other ACLs", "principal", "permission", "operation", "resource", "pattern", "name")
        for b in raw:
            t.add_row(b.principal, b.permission, b.operation, b.resource_type, b.pattern, b.name)
        print_table(t)
