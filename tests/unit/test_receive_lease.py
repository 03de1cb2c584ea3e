"""The rules of a RECEIVE lease's end (core/receive/receive_lease.py), the consumer's back-pressure
(core/receive/group_buffer.pause_change) and when an empty RECEIVE is an answer (core/receive/offsets.caught_up),
without a broker. The receiver that applies them is exercised over fake consumers in
test_receiver_backpressure.py, test_receiver_assignment.py and
test_receiver_reassignment.py."""

from __future__ import annotations

from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.receive.group_buffer import Buffered, pause_change
from kbroker.core.receive.offsets import PartitionOffsets, caught_up, decode_completed
from kbroker.core.receive.receive_lease import completed, lost_partition, reopened, returned, split_off


class FakeRecord:
    def value(self) -> bytes:
        return b""


def rec(partition: int, offset: int, assignment: PartitionOffsets | None = None) -> Buffered:
    env = Envelope(f"m{offset}", "g", "g", offset, "T", "C", "F", "S", "TARGET")
    return Buffered(env, FakeRecord(), partition, offset, offset, assignment)


def tracking(*fetched: tuple[int, int]) -> dict[int, PartitionOffsets]:
    offsets: dict[int, PartitionOffsets] = {}
    for p, off in fetched:
        offsets.setdefault(p, PartitionOffsets(0)).fetched(off)
    return offsets


def test_a_lease_over_a_partition_no_longer_owned_or_owned_anew_is_lost():
    offsets = tracking((0, 1), (1, 5))
    fetched_under = dict(offsets)
    assert lost_partition([(0, 1), (2, 5)], fetched_under, offsets)
    assert not lost_partition([(0, 1), (1, 5)], fetched_under, offsets)
    assert not lost_partition([], {}, {})
    offsets[1] = PartitionOffsets(0)  # partition 1 revoked and assigned again
    assert lost_partition([(0, 1), (1, 5)], fetched_under, offsets)


def test_completing_commits_each_touched_partition_at_its_low_water():
    offsets = tracking((0, 0), (0, 1), (0, 2), (1, 0))
    got = completed(offsets, [(0, 0), (0, 2), (1, 0)])
    assert [(p, pos) for p, pos, _ in got] == [(0, 1), (1, 1)]
    assert decode_completed(1, got[0][2]) == {2}  # completed above the low water: in the metadata


def test_reopening_undoes_completion_where_the_partition_is_still_owned():
    offsets = tracking((0, 0), (0, 1))
    fetched_under = dict(offsets)
    completed(offsets, [(0, 0)])
    reopened(offsets, [(0, 0), (3, 9)], fetched_under)  # partition 3 was revoked meanwhile: nothing to undo
    assert offsets[0].commit_position()[0] == 0


def test_reopening_leaves_a_new_assignment_of_the_partition_alone():
    offsets = tracking((0, 0), (0, 1))
    fetched_under = dict(offsets)
    offsets[0] = anew = PartitionOffsets(0)  # revoked and assigned again, read anew
    anew.fetched(0)
    completed(offsets, [(0, 0)])
    reopened(offsets, [(0, 0)], fetched_under)  # the old lease's abort
    assert anew.commit_position()[0] == 1


def test_a_rollback_returns_only_records_of_the_current_assignment():
    offsets = tracking((0, 1), (1, 2), (0, 3))
    taken = [rec(0, 1, offsets[0]), rec(1, 2, offsets[1]), rec(0, 3, offsets[0])]
    assert returned(taken, committed=False, doomed=False, offsets={0: offsets[0]}) == [taken[0], taken[2]]
    assert returned(taken, committed=True, doomed=False, offsets=offsets) == []
    assert returned(taken, committed=False, doomed=True, offsets=offsets) == []
    assert returned(taken, committed=False, doomed=False, offsets={0: PartitionOffsets(0), 1: offsets[1]}) == [
        taken[1]
    ], "partition 0 was assigned again: its old copies are read anew"


def test_a_split_keeps_both_sides_in_order():
    taken = [rec(0, 1), rec(0, 2), rec(0, 3)]
    offsets = [b.position for b in taken]
    (kept, kept_offsets), (moved, moved_offsets) = split_off(taken, offsets, {(0, 1), (0, 3)})
    assert kept == [taken[1]] and kept_offsets == [(0, 2)]
    assert moved == [taken[0], taken[2]] and moved_offsets == [(0, 1), (0, 3)]


def test_the_consumer_pauses_at_the_bound_and_resumes_at_half():
    assert pause_change(False, 10, 10) is True
    assert pause_change(False, 9, 10) is None
    assert pause_change(True, 6, 10) is None
    assert pause_change(True, 5, 10) is False
    assert pause_change(True, 20, 10) is None


def test_an_empty_receive_is_an_answer_only_once_every_owned_partition_was_read_to_its_end():
    assert not caught_up({}, set())
    assert not caught_up({0: None, 1: None}, {0})
    assert caught_up({0: None, 1: None}, {0, 1, 2})
