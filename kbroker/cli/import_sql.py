"""`kbroker import-sql FILE.sql...`: a database's Service Broker DDL turned into catalog YAML that
`kbroker apply` takes (the mapping is core/catalog/tsql/, docs/catalog.md#importing-t-sql)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kbroker.cli.common import emit_json, fail, handle_errors, json_option, main

# The byte order marks a script may start with: SSMS saves scripts as UTF-16 ("Unicode") by default.
_BOMS = ((b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"), (b"\xef\xbb\xbf", "utf-8-sig"))


def read_script(path: str) -> str:
    """A script's text: UTF-8, or UTF-16 or UTF-8 with a byte order mark; a one-line error otherwise."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        fail(f"{path}: cannot read: not UTF-8 text, nor UTF-16 with a byte order mark")


@main.command("import-sql")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write DIR/<script>.yaml for each script that creates objects (those objects) instead of printing one file.",
)
@json_option
@handle_errors
def import_sql_cmd(files: tuple[str, ...], out_dir: str | None, as_json: bool) -> None:
    """Turn the Service Broker DDL of FILES (CREATE MESSAGE TYPE, CONTRACT, QUEUE, SERVICE, ROUTE,
    BROKER PRIORITY; ALTER QUEUE, MESSAGE TYPE, BROKER PRIORITY; ALTER DATABASE ... SET
    HONOR_BROKER_PRIORITY; DROP as `drop:` entries) into catalog YAML for `kbroker apply`. What has no place in
    the catalog is a note naming its file and line; an error (a name the catalog refuses, a route
    address with no Kafka form, a statement that does not parse) writes nothing and exits 1."""
    from kbroker.core.catalog.tsql.to_catalog import LABELS, import_scripts, render_yaml

    paths = list(dict.fromkeys(files))  # a script named twice is read once
    imported = import_scripts((path, read_script(path)) for path in paths)
    written: dict[str, str] = {}  # file written -> what it holds
    if not imported.errors and out_dir is not None:
        by_file = imported.by_file()
        outputs = {path: Path(out_dir) / (Path(path).stem + ".yaml") for path in by_file}
        clash = _first_clash(outputs)
        if clash:
            fail(f"{clash[0]} and {clash[1]} would both be written to {outputs[clash[0]]}: rename one")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for path, definitions in by_file.items():
            outputs[path].write_text(render_yaml(definitions, [path]), encoding="utf-8")
            written[str(outputs[path])] = ", ".join(
                f"{len(objects)} {LABELS[section]}{'' if len(objects) == 1 else 's'}"
                for section, objects in definitions.items()
            )
    if as_json:
        emit_json({**imported.as_dict(), "written": list(written)})
    else:
        for note in imported.notes:
            click.echo(f"kbroker: note: {note}", err=True)
        for error in imported.errors:
            click.echo(f"kbroker: error: {error}", err=True)
        if not imported.errors and out_dir is None:
            click.echo(render_yaml(imported.definitions, paths), nl=False)
        for path, counts in written.items():
            click.echo(f"wrote {path}: {counts}")
        if out_dir is not None and not imported.errors and not written:
            click.echo("the scripts create no catalog objects: nothing written")
    if imported.errors:
        sys.exit(1)


def _first_clash(outputs: dict[str, Path]) -> tuple[str, str] | None:
    seen: dict[Path, str] = {}
    for path, out in outputs.items():
        if out in seen:
            return seen[out], path
        seen[out] = path
    return None
