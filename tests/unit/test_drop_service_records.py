"""DROP SERVICE's records for one open endpoint (core/dialogs/send_records.py), with no broker:
the far side's Error -8470 or acknowledging EndDialog, this side CLOSED; and the far side's END
after it when the service is gone from the catalog."""

from __future__ import annotations

from kbroker.core.catalog.drops import dropped
from kbroker.core.catalog.models import END_DIALOG
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dialogs.conversation_endpoint import CLOSED
from kbroker.core.dialogs.send_records import SERVICE_DROPPED
from tests.unit.test_statements import World, headers


def test_an_open_dialog_gets_error_8470_and_closes() -> None:
    world = World()
    ep = world.statements.message_record(world.dialog(), "//Adventure-Works.com/Expenses/ExpenseClaim", {})[2]
    records, closed = world.statements.service_dropped_records(ep)
    [record] = records
    assert headers(record)["kb.message_type_name"] == ERROR_TYPE
    assert headers(record)["kb.message_sequence_number"] == str(ep.send_sequence)
    assert record[2] == (
        b'<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>-8470</Code>'
        b"<Description>Remote service has been dropped.</Description></Error>"
    )
    assert SERVICE_DROPPED == -8470
    assert closed.state == CLOSED and closed.cleaned_up


def test_a_peer_that_ended_is_acknowledged_and_an_unsent_dialog_closes_silently() -> None:
    world = World()
    ep = world.statements.message_record(world.dialog(), "//Adventure-Works.com/Expenses/ExpenseClaim", {})[2]
    records, closed = world.statements.service_dropped_records(ep.after_peer_error())
    assert [headers(r)["kb.message_type_name"] for r in records] == [END_DIALOG] and closed.state == CLOSED
    records, closed = world.statements.service_dropped_records(world.dialog())  # STARTED_OUTBOUND
    assert records == [] and closed.state == CLOSED
    records, closed = world.statements.service_dropped_records(ep.after_send().after_local_end())  # DO
    assert records == [] and closed.state == CLOSED


def test_the_far_sides_end_after_the_error_closes_without_an_acknowledgement() -> None:
    world = World()
    ep = world.statements.message_record(world.dialog(), "//Adventure-Works.com/Expenses/ExpenseClaim", {})[2]
    errored = ep.after_peer_error()  # the initiator got the target service's -8470
    world.catalog = dropped(world.catalog, "service", "//Adventure-Works.com/Expenses")
    records, ended = world.statements.end_records(errored, error=None, description=None, cleanup=False)
    assert records == [] and ended is not None and ended.state == CLOSED
