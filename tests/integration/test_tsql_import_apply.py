"""`kbroker import-sql` then `kbroker apply` on the real broker: Microsoft's tutorial scripts
(tests/data/tsql/) become a namespace's catalog, read back as imported."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kbroker.core import names
from kbroker.kafka.catalog.catalog_store import read_catalog
from tests.helpers import DATA, KBROKER


def kbroker(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBROKER_BOOTSTRAP": bootstrap}
    env.pop("KBROKER_NAMESPACE", None)
    return subprocess.run([KBROKER, *args], capture_output=True, text=True, env=env, timeout=120)


def test_imported_tutorials_apply_and_read_back_as_imported(kafka_bootstrap, namespace, tmp_path: Path):
    scripts = [str(DATA / "tsql" / "internal_activation.sql"), str(DATA / "tsql" / "expenses.sql")]
    out = tmp_path / "catalog"
    imported = kbroker(kafka_bootstrap, "import-sql", *scripts, "-o", str(out))
    assert imported.returncode == 0, imported.stderr
    assert sorted(p.name for p in out.iterdir()) == ["expenses.yaml", "internal_activation.yaml"]

    applied = kbroker(kafka_bootstrap, "apply", str(out), "--namespace", namespace, "--json")
    assert applied.returncode == 0, applied.stderr
    catalog = read_catalog(kafka_bootstrap, namespace)
    assert set(catalog.queues) == {"TargetQueueIntAct", "InitiatorQueueIntAct", "ExpenseQueue", "Expense-Replies"}
    target = catalog.queue("TargetQueueIntAct")
    assert (target.activation.status, target.activation.procedure, target.activation.max_queue_readers) == (
        "ON",
        "procedures:TargetActivProc",
        10,
    )
    assert (catalog.queue("ExpenseQueue").retention, catalog.queue("ExpenseQueue").poison_message_handling) == (
        "ON",
        "OFF",
    )
    assert catalog.service_accepts("//AWDB/InternalAct/TargetService", "//AWDB/InternalAct/SampleContract")
    assert catalog.may_send("//AWDB/InternalAct/SampleContract", "//AWDB/InternalAct/ReplyMessage", "TARGET")
    assert catalog.routes["ExpenseRoute"].namespace == "expenses" and catalog.routes["ExpenseRoute"].created_at
    assert names.queue_topic(namespace, "Expense-Replies") in applied.stdout
    p = catalog.broker_priorities["ExpensePriority"]
    assert (p.contract, p.local_service, p.remote_service, p.priority) == (
        "//Adventure-Works.com/Expenses/ExpenseSubmission",
        "ANY",
        "//Adventure-Works.com/Expenses",
        7,
    )

    again = kbroker(kafka_bootstrap, "apply", str(out), "--namespace", namespace)
    assert (again.returncode, again.stdout) == (0, f"namespace {namespace}: nothing to change\n")


def test_a_later_script_alters_and_drops_what_is_applied(kafka_bootstrap, namespace, tmp_path: Path):
    """A second script, imported and applied after the first: HONOR_BROKER_PRIORITY, a priority
    dropped, and a queue dropped with its service and the route naming it (users first, whatever the
    script's order)."""
    first = tmp_path / "first"
    assert kbroker(kafka_bootstrap, "import-sql", str(DATA / "tsql" / "expenses.sql"), "-o", str(first)).returncode == 0
    assert kbroker(kafka_bootstrap, "apply", str(first), "--namespace", namespace).returncode == 0
    later = tmp_path / "later.sql"
    later.write_text(
        "ALTER DATABASE CURRENT SET HONOR_BROKER_PRIORITY ON;\n"
        "DROP BROKER PRIORITY ExpensePriority;\n"
        "DROP QUEUE [Expense-Replies];\n"
        "DROP SERVICE [//Adventure-Works.com/Employees];\n"
        "DROP ROUTE [Local Expenses];\n"
    )
    out = tmp_path / "second"
    imported = kbroker(kafka_bootstrap, "import-sql", str(later), "-o", str(out))
    assert imported.returncode == 0, imported.stderr
    applied = kbroker(kafka_bootstrap, "apply", str(out), "--namespace", namespace, "--json")
    assert applied.returncode == 0, applied.stderr
    catalog = read_catalog(kafka_bootstrap, namespace)
    assert catalog.honor_broker_priority and not catalog.broker_priorities
    assert "Expense-Replies" not in catalog.queues and "//Adventure-Works.com/Employees" not in catalog.services
