"""The G1 checker of the multi-process runs (tests/helpers/invariants.lock_violations): when one
hold of a group ends and the next may begin."""

from tests.helpers.invariants import lock_violations


def hold(pid: int, leased: float, committing: float, committed: float, group: str = "g") -> dict:
    return {"group": group, "pid": pid, "reader": 0, "leased": leased, "committing": committing, "committed": committed}


def test_another_process_leasing_before_the_commit_call_is_a_violation():
    assert lock_violations([hold(1, 1.0, 3.0, 3.1), hold(2, 2.0, 4.0, 4.1)]) == ["g: 1/0 and 2/0"]


def test_another_process_may_lease_once_an_in_doubt_commit_took_effect():
    # The first commit's answer came 10 s late (settled after a stall); the broker had committed
    # its offsets before the second process could read past its messages.
    assert lock_violations([hold(1, 1.0, 2.0, 12.0), hold(2, 5.0, 6.0, 6.1)]) == []


def test_a_thread_of_the_same_process_waits_for_the_commit_to_return():
    assert lock_violations([hold(1, 1.0, 2.0, 12.0), hold(1, 5.0, 6.0, 6.1)]) == ["g: 1/0 and 1/0"]


def test_holds_of_different_groups_never_conflict():
    assert lock_violations([hold(1, 1.0, 3.0, 3.1, "a"), hold(2, 2.0, 4.0, 4.1, "b")]) == []
