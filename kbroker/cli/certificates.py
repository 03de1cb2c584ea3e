"""`kbroker certificate create|import|export|list|drop`: the services' certificates of dialog
security (kafka/security/certificates.py), in this machine's keys directory (KBROKER_KEYS_DIR).

    kbroker certificate create OrdersCert --user dbo --subject "Orders service"
    kbroker certificate export OrdersCert -o orders.crt          # give it to the far side
    kbroker certificate import SalesCert --user sales_user sales.crt
    kbroker certificate list --json
"""

from __future__ import annotations

from pathlib import Path

import click

from kbroker.cli.common import emit_json, handle_errors, json_option, main
from kbroker.cli.output import new_table, print_table


def _store(keys_dir: str | None):
    from kbroker.kafka.security.certificates import CertificateStore

    return CertificateStore(Path(keys_dir) / "certificates" if keys_dir else None)


_KEYS_DIR = click.option(
    "--keys-dir", envvar="KBROKER_KEYS_DIR", default=None, help="The keys directory (default: KBROKER_KEYS_DIR)."
)


@main.group("certificate")
def certificate() -> None:
    """CREATE CERTIFICATE and its kin: the certificates that secure routed dialogs."""


@certificate.command("create")
@click.argument("name")
@click.option("--user", "owner", default="dbo", show_default=True, help="AUTHORIZATION: the user who owns it.")
@click.option("--subject", default=None, help="WITH SUBJECT (default: the name).")
@click.option("--days", default=365, show_default=True, type=int, help="How long it stays valid (EXPIRY_DATE).")
@_KEYS_DIR
@json_option
@handle_errors
def create(name, owner, subject, days, keys_dir, as_json):
    """A new certificate with its private key, owned by USER (a service's owner signs with it)."""
    cert = _store(keys_dir).create(name, owner, subject or name, days=days)
    if as_json:
        emit_json(cert.row())
        return
    click.echo(f"certificate {cert.name} created for user {cert.owner}, valid to {cert.expiry_date:%Y-%m-%d}")
    click.echo(f"  thumbprint {cert.thumbprint}; give the far side `kbroker certificate export {cert.name}`")


@certificate.command("import")
@click.argument("name")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--user", "owner", required=True, help="AUTHORIZATION: the user who owns it (a binding's user).")
@_KEYS_DIR
@json_option
@handle_errors
def import_(name, file, owner, keys_dir, as_json):
    """CREATE CERTIFICATE ... FROM FILE: a far service's certificate (no private key)."""
    cert = _store(keys_dir).import_(name, owner, Path(file).read_bytes())
    if as_json:
        emit_json(cert.row())
        return
    click.echo(f"certificate {cert.name} imported for user {cert.owner}, valid to {cert.expiry_date:%Y-%m-%d}")


@certificate.command("export")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write it here (default: stdout).")
@_KEYS_DIR
@handle_errors
def export(name, output, keys_dir):
    """BACKUP CERTIFICATE: the certificate's PEM, never its private key."""
    pem = _store(keys_dir).export(name)
    if output:
        Path(output).write_bytes(pem)
        click.echo(f"certificate {name} written to {output}", err=True)
    else:
        click.echo(pem.decode(), nl=False)


@certificate.command("drop")
@click.argument("name")
@_KEYS_DIR
@handle_errors
def drop(name, keys_dir):
    """DROP CERTIFICATE: removes it (and its private key) from this machine."""
    _store(keys_dir).drop(name)
    click.echo(f"certificate {name} dropped")


@certificate.command("list")
@_KEYS_DIR
@json_option
@handle_errors
def list_(keys_dir, as_json):
    """sys.certificates: the certificates on this machine."""
    rows = [c.row() for c in _store(keys_dir).certificates()]
    if as_json:
        emit_json(rows)
        return
    table = new_table("certificates", "name", "principal", "subject", "expiry_date", "private key", "thumbprint")
    for r in rows:
        table.add_row(
            str(r["name"]),
            str(r["principal"]),
            str(r["subject"]),
            str(r["expiry_date"])[:10],
            "yes" if r["pvt_key_encryption_type_desc"] != "NO_PRIVATE_KEY" else "no",
            str(r["thumbprint"])[:16],
        )
    print_table(table)
