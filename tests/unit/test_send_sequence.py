"""The sequence-number rules of the endpoints cache (core/dialogs/send_sequence.py), without a broker:
what the next SEND gets after a record is read back, a transaction in doubt, a lease taken, and
what a clean close or a release writes. The records on the real broker are checked in
tests/integration/test_sequences.py and test_send_leases.py."""

from __future__ import annotations

from dataclasses import replace

from kbroker.core.dialogs.conversation_endpoint import CONVERSING, SEQUENCE_BLOCK, Endpoint, handle_for
from kbroker.core.dialogs.send_lease import SendLease
from kbroker.core.dialogs.send_sequence import (
    advanced,
    block_released,
    claim_start,
    continued,
    keeps_exact,
    past_doubt,
    reservation_after,
)

EP = Endpoint(handle_for("c", "INITIATOR"), "c", "INITIATOR", "c", "c", "S", "T", "K", CONVERSING)


def at(send: int, reserved: int) -> Endpoint:
    return replace(EP, send_sequence=send, sequence_reserved=reserved)


def test_the_exact_state_is_kept_where_the_topic_falls_short_of_it():
    assert keeps_exact(at(3, 64), written=False)  # a SEND within the block: no record
    assert keeps_exact(at(1, 65), written=True)  # a written record whose block is not used up
    assert not keeps_exact(at(65, 65), written=True)  # the record says the exact next number


def test_the_reservation_only_rises():
    assert reservation_after(None, at(0, 64)) == 64
    assert reservation_after(128, at(0, 64)) == 128
    assert reservation_after(None, at(0, 0)) == 0


def test_a_record_this_process_wrote_continues_at_its_exact_count():
    read = at(1, 65)
    assert continued(read, mine=65, exact=at(7, 65), floor=0).send_sequence == 7
    assert continued(read, mine=65, exact=None, floor=0) is read  # nothing kept: as written


def test_anyone_elses_record_continues_past_its_block():
    assert continued(at(1, 65), mine=None, exact=None, floor=0).send_sequence == 65
    # A reservation above this process's latest is someone else's, whatever this process kept.
    assert continued(at(70, 134), mine=65, exact=at(7, 65), floor=0).send_sequence == 134


def test_a_lease_floor_is_never_undercut():
    assert continued(at(1, 65), mine=65, exact=at(7, 65), floor=1024).send_sequence == 1024
    assert continued(at(2000, 2000), mine=None, exact=None, floor=1024).send_sequence == 2000


def test_a_transaction_in_doubt_moves_past_everything_either_reserved():
    known = replace(at(5, 64), state="DO")
    after = past_doubt(known, at(9, 73))
    assert (after.send_sequence, after.sequence_reserved, after.state) == (73, 73, "DO")
    assert past_doubt(at(100, 164), at(9, 73)).send_sequence == 164


def test_a_release_writes_the_exact_next_number():
    assert block_released(at(7, 64)) == at(7, 7)


def test_taking_a_lease_moves_the_endpoint_up_to_its_start_only():
    assert advanced(at(3, SEQUENCE_BLOCK), 1024) == at(1024, 1024)
    assert advanced(at(3, 2000), 1024) == at(1024, 2000)
    assert advanced(at(1024, 1088), 1024) is None


def test_a_release_says_where_the_next_holder_starts_whatever_older_records_say():
    """The releaser wrote its exact endpoint and then its release; a taker that has read the release
    but, in another partition, only the releaser's earlier record (which reserved up to 75 and so
    continues past it) starts at the release's exact 15, not 75: no gap."""
    seen = continued(at(11, 75), None, None, 0)  # another process's record, read so far
    assert seen.send_sequence == 75
    release = SendLease(EP.conversation_handle, 3, None, "a", 1_000.0, 15)
    assert claim_start(seen, release) == 15
    # A lease that ran out (its owner stopped) says nothing exact: past everything either says.
    ran_out = SendLease(EP.conversation_handle, 3, "a", "a", 1_000.0, 1_035)
    assert claim_start(seen, ran_out) == 1_035 and claim_start(at(2_000, 2_064), ran_out) == 2_000
    # Nobody ever held it: past the endpoint's reservation.
    assert claim_start(at(11, 75), None) == 75
