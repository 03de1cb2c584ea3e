"""What apply keeps of a queue's published status (core/catalog/drops.py keep_statuses): a queue
disabled by `kbroker queue disable` or by poison message handling stays disabled when a
definition file that does not name `status` is applied again, as ALTER QUEUE changes only what
it names; a file that names it sets it; a new queue takes ON."""

from __future__ import annotations

from kbroker.core.catalog.drops import keep_statuses
from kbroker.core.catalog.models import Catalog, Queue


def catalog(**queues: Queue) -> Catalog:
    return Catalog(namespace="ns", queues=queues)


def test_a_disabled_queue_stays_disabled_unless_the_file_names_its_status():
    published = catalog(A=Queue(name="A", status="OFF"), B=Queue(name="B", status="OFF"))
    files = catalog(
        A=Queue.model_validate({"name": "A"}),  # status not named
        B=Queue.model_validate({"name": "B", "status": "ON"}),  # named: ALTER QUEUE B WITH STATUS = ON
        C=Queue.model_validate({"name": "C"}),  # new
    )
    kept = keep_statuses(files, published)
    assert {n: q.status for n, q in kept.queues.items()} == {"A": "OFF", "B": "ON", "C": "ON"}
    assert (
        keep_statuses(catalog(A=Queue.model_validate({"name": "A", "status": "OFF"})), catalog()).queues["A"].status
        == "OFF"
    )
