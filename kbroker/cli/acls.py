"""`kbroker acls`: least privilege for each kbroker role (core/security/acl_roles.py), applied as Kafka
ACLs by an administrator's principal (kafka/security/acls.py).

    kbroker acls roles --namespace sales                  # what each role needs, and why
    kbroker acls apply --role app --principal User:orders --namespace sales
    kbroker acls apply --role worker --principal User:worker --route-to billing
    kbroker acls show --principal User:orders
    kbroker acls remove --role app --principal User:orders --namespace sales
"""

from __future__ import annotations

import click

from kbroker.cli.common import cluster_options, emit_json, handle_errors, json_option, main
from kbroker.cli.output import new_table, print_table
from kbroker.core.security.acl_roles import ROLES


@main.group("acls")
def acls_group() -> None:
    """Kafka ACLs for kbroker's roles: each role's principal gets only what it needs."""


def _role_options(fn):
    fn = click.option(
        "--route-to",
        "routes_to",
        multiple=True,
        metavar="NS",
        help="router/worker: a namespace on this cluster the transmitter delivers to (repeatable).",
    )(fn)
    fn = click.option(
        "--endpoint",
        default=None,
        help="transport-installer/-runner: only this endpoint's queues (default: every transport "
        "queue of the namespace).",
    )(fn)
    return fn


def _plan(role: str, principal: str, target, endpoint: str | None, routes_to: tuple[str, ...]):
    from kbroker.core.security.acl_roles import bindings

    return bindings(role, principal, target.namespace, endpoint=endpoint, routes_to=routes_to)


def _emit(rows, as_json: bool, title: str) -> None:
    if as_json:
        emit_json([b.as_dict() for b in rows])
        return
    if not rows:
        click.echo(f"{title}: none")
        return
    t = new_table(title, "principal", "operation", "resource", "pattern", "name", "permission")
    for b in rows:
        t.add_row(b.principal, b.operation, b.resource_type, b.pattern, b.name, b.permission)
    print_table(t)


@acls_group.command("roles")
@click.option("--role", type=click.Choice(list(ROLES)), default=None, help="Only this role.")
@_role_options
@cluster_options
@json_option
@handle_errors
def roles_cmd(role, endpoint, routes_to, target, as_json):
    """What each role needs in the namespace: resource, pattern, operations and why. Reads
    nothing from Kafka."""
    from kbroker.core.security.acl_roles import rules

    names = [role] if role else list(ROLES)
    rows = [
        {
            "role": name,
            "summary": ROLES[name].summary,
            "resource_type": r.resource_type,
            "pattern": r.pattern,
            "name": r.name,
            "operations": list(r.operations),
            "why": r.why,
        }
        for name in names
        for r in rules(name, target.namespace, endpoint=endpoint, routes_to=routes_to)
    ]
    if as_json:
        emit_json(rows)
        return
    t = new_table(f"roles in namespace {target.namespace}", "role", "resource", "pattern", "name", "operations", "why")
    for r in rows:
        t.add_row(r["role"], r["resource_type"], r["pattern"], r["name"], ",".join(r["operations"]), r["why"])
    print_table(t)


@acls_group.command("apply")
@click.option("--role", type=click.Choice(list(ROLES)), required=True)
@click.option("--principal", required=True, help="Kafka's principal, e.g. User:orders.")
@_role_options
@click.option("--dry-run", is_flag=True, help="Print the ACLs, do not create them.")
@cluster_options
@json_option
@handle_errors
def apply_cmd(role, principal, endpoint, routes_to, dry_run, target, as_json):
    """Grant PRINCIPAL what ROLE needs in the namespace (as a principal that may alter the
    cluster's ACLs); returns once the cluster lists them. ACLs already there stay."""
    plan = _plan(role, principal, target, endpoint, routes_to)
    if not dry_run:
        from kbroker.kafka.security.acls import grant

        grant(target.cluster, plan)
    _emit(plan, as_json, f"{'would grant' if dry_run else 'granted'} role {role} in namespace {target.namespace}")


@acls_group.command("remove")
@click.option(
    "--role",
    type=click.Choice(list(ROLES)),
    default=None,
    help="Only what this role was granted (default with --all: every ACL of the principal).",
)
@click.option("--principal", required=True, help="Kafka's principal, e.g. User:orders.")
@click.option("--all", "everything", is_flag=True, help="Every ACL of the principal, whatever granted it.")
@_role_options
@cluster_options
@json_option
@handle_errors
def remove_cmd(role, principal, everything, endpoint, routes_to, target, as_json):
    """Revoke what ROLE was granted to PRINCIPAL in the namespace (or, with --all, every ACL of
    PRINCIPAL); prints the ACLs deleted."""
    from kbroker.kafka.security.acls import revoke, revoke_all

    if everything == (role is not None):
        raise click.UsageError("give --role ROLE or --all")
    removed = (
        revoke_all(target.cluster, principal)
        if everything
        else revoke(target.cluster, _plan(role, principal, target, endpoint, routes_to))
    )
    _emit(removed, as_json, "removed")


@acls_group.command("show")
@click.option("--principal", default=None, help="Only this principal's ACLs (default: every ACL).")
@cluster_options
@json_option
@handle_errors
def show_cmd(principal, target, as_json):
    """The cluster's ACLs (of PRINCIPAL)."""
    from kbroker.kafka.security.acls import listed

    _emit(listed(target.cluster, principal), as_json, f"ACLs of {principal}" if principal else "ACLs")
