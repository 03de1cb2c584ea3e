"""`kbroker key rotate|export|import|list`: the namespaces' master keys that sign routed
messages and derive their dialogs' session keys (kafka/routing/keys.py), in this machine's keys
directory (KBROKER_KEYS_DIR).

    kbroker key export orders -o orders.pub            # give it to the namespaces orders sends to
    kbroker key import orders orders.pub               # on each of them
    kbroker key rotate orders --grace-days 7           # then export and import again
    kbroker key list --json
"""

from __future__ import annotations

from pathlib import Path

import click

from kbroker.cli.common import emit_json, handle_errors, json_option, main
from kbroker.cli.output import new_table, print_table


def _keys(keys_dir: str | None):
    from kbroker.kafka.routing.keys import Keys

    return Keys(Path(keys_dir) if keys_dir else None)


_KEYS_DIR = click.option(
    "--keys-dir", envvar="KBROKER_KEYS_DIR", default=None, help="The keys directory (default: KBROKER_KEYS_DIR)."
)


@main.group("key")
def key() -> None:
    """The namespaces' master keys: exchanged between namespaces that route to each other."""


@key.command("rotate")
@click.argument("namespace")
@click.option(
    "--grace-days",
    default=7.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long far sides still accept what the old key signed.",
)
@_KEYS_DIR
@json_option
@handle_errors
def rotate(namespace, grace_days, keys_dir, as_json):
    """A new master key for NAMESPACE; the old one is kept to open its dialogs' replies."""
    new, old, until = _keys(keys_dir).rotate(namespace, grace_days * 86400)
    if as_json:
        emit_json({"namespace": namespace, "id": new, "retired": old, "old_accepted_until": until.isoformat()})
        return
    click.echo(f"namespace {namespace}: master key {new}; {old} retired, accepted until {until:%Y-%m-%d %H:%M} UTC")
    click.echo(
        f"  give the namespaces it sends to `kbroker key export {namespace}` now: until they import it, "
        "its messages wait in the transmission queue and are retried"
    )


@key.command("export")
@click.argument("namespace")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write it here (default: stdout).")
@_KEYS_DIR
@handle_errors
def export(namespace, output, keys_dir):
    """NAMESPACE's public keys (never a private one), made with its master key when there is none."""
    text = _keys(keys_dir).export(namespace)
    if output:
        Path(output).write_text(text)
        click.echo(f"public keys of namespace {namespace} written to {output}", err=True)
    else:
        click.echo(text, nl=False)


@key.command("import")
@click.argument("namespace")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_KEYS_DIR
@json_option
@handle_errors
def import_(namespace, file, keys_dir, as_json):
    """Accept routed messages signed by NAMESPACE's keys in FILE (`kbroker key export`'s)."""
    found = _keys(keys_dir).import_(namespace, Path(file).read_text())
    rows = [{"id": a.id, "until": None if a.until is None else a.until.isoformat()} for a in found]
    if as_json:
        emit_json({"namespace": namespace, "keys": rows})
        return
    click.echo(f"namespace {namespace}: {len(rows)} public key(s) accepted ({', '.join(r['id'] for r in rows)})")


@key.command("list")
@_KEYS_DIR
@json_option
@handle_errors
def list_(keys_dir, as_json):
    """The master keys and accepted public keys on this machine."""
    rows = _keys(keys_dir).rows()
    if as_json:
        emit_json(rows)
        return
    table = new_table("keys", "namespace", "id", "kind", "until")
    for r in rows:
        table.add_row(str(r["namespace"]), str(r["id"]), str(r["kind"]), str(r["until"] or "-"))
    print_table(table)
