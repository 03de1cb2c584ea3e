"""The `kbroker` command. Each sub-module adds the commands of one concept; `cli/common.py` holds
the shared conventions: `--bootstrap`/`--namespace` options, `--json` output, and one-line errors."""

from __future__ import annotations

from kbroker.cli.common import handle_errors, main

__all__ = ["handle_errors", "main"]

# The command modules attach their commands to `main`; imported here so `kbroker --help` lists them.
from kbroker.cli import (  # noqa: F401
    acls,
    activator,
    analytics,
    bench,
    broker,
    catalog,
    certificates,
    diagnose,
    import_sql,
    keys,
    messaging,
    permissions,
    routes,
    routing,
    transport_endpoint,
    transport_errors,
    transport_pubsub,
    views,
    worker,
)
