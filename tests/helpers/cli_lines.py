"""A `kbroker` command line as a deployment file writes it (the compose file, the Kubernetes
manifests), parsed by the real CLI in that file's environment alone: tests/unit/test_compose.py
and tests/unit/test_kubernetes.py check their command lines and probes with it."""

from __future__ import annotations

import os
from unittest import mock

import click

from kbroker.cli import main


def parse(argv: list[str], env: dict[str, str]) -> list[click.Context]:
    """Parse `kbroker ARGS` with the real click command, group by group, in the given environment
    alone (the service's, not this process's): a misspelled command or option, a bad value or a
    missing argument raises click's error. The contexts from `kbroker` down to the command."""
    contexts: list[click.Context] = []
    command: click.Command = main
    name, args, parent = "kbroker", list(argv[1:]), None
    with mock.patch.dict(os.environ, env, clear=True):
        while True:
            ctx = command.make_context(name, args, parent=parent, resilient_parsing=False)
            contexts.append(ctx)
            if not isinstance(command, click.Group):
                return contexts
            protected = getattr(ctx, "_protected_args", None)  # click 8.2+; protected_args before
            rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
            if not rest:
                raise click.UsageError("a command is missing", ctx)
            name, found, args = command.resolve_command(ctx, rest)
            if found is None:
                raise click.UsageError(f"no such command {name!r}", ctx)
            command, parent = found, ctx


def command_path(contexts: list[click.Context]) -> str:
    return " ".join(c.info_name or "" for c in contexts)
