"""The shared `--bootstrap`/`--namespace` options (kbroker/cli/common.py): a command gets a Target
whose cluster follows the broker rule only when the command reads it."""

from __future__ import annotations

import click
from click.testing import CliRunner

from kbroker.cli.common import Target, cluster_options, handle_errors
from kbroker.core.cluster import Cluster


@click.command()
@click.option("--fail-first", is_flag=True)
@cluster_options
@handle_errors
def probe(fail_first: bool, target: Target) -> None:
    if fail_first:
        raise ValueError("bad option")  # before any broker is looked for
    click.echo(f"{target.cluster!r} {target.namespace} {target.explicit!r}")


def test_the_flag_and_the_environment_give_the_cluster(monkeypatch):
    monkeypatch.delenv("KBROKER_NAMESPACE", raising=False)
    out = CliRunner().invoke(probe, ["--bootstrap", "h:1", "--namespace", "ns"]).output
    assert out.strip() == f"{Cluster('h:1')!r} ns {Cluster('h:1')!r}"
    out = CliRunner().invoke(probe, [], env={"KBROKER_BOOTSTRAP": "e:2", "KBROKER_NAMESPACE": None}).output
    assert out.strip() == f"{Cluster('e:2')!r} default {Cluster('e:2')!r}"


def test_no_broker_is_looked_for_before_the_command_reads_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KBROKER_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(probe, ["--fail-first"], env={"KBROKER_BOOTSTRAP": None})
    assert result.output.strip() == "kbroker: error: bad option"
    result = CliRunner().invoke(probe, [], env={"KBROKER_BOOTSTRAP": None})
    assert result.exit_code == 1 and "no broker" in result.output
