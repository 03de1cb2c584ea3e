"""Savepoints' pure bookkeeping: T-SQL's naming rules (core/txn/savepoints.py), a model-based
property of SAVE / ROLLBACK TRANSACTION name over a pending state, and what a rollback to a
savepoint does to a lease's records and its group (core/receive/receive_lease.rolled_back_to,
GroupBuffer.put_back). No broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.receive.group_buffer import Buffered, GroupBuffer
from kbroker.core.receive.receive_lease import rolled_back_to
from kbroker.core.txn.savepoints import MAX_NAME, Savepoints, check_name
from kbroker.errors import InvalidArgumentError, KBrokerError, SavepointNotFoundError
from tests.unit.test_group_buffer import NO_FULL, NOW_MS, FakeLease, buffer_of, rec, take


def test_rollback_goes_to_the_latest_savepoint_of_a_name_and_drops_the_later_ones() -> None:
    sp: Savepoints[int] = Savepoints()
    sp.save("a", 1)
    sp.save("b", 2)
    sp.save("a", 3)
    sp.save("c", 4)
    assert sp.rollback_to("a") == 3  # the latest "a"
    assert sp.names == ("a", "b", "a")  # "c" is gone, "a" stays
    assert sp.rollback_to("a") == 3  # again: it stays until something rolls back past it
    assert sp.rollback_to("b") == 2
    assert sp.names == ("a", "b")
    with pytest.raises(SavepointNotFoundError):
        sp.rollback_to("c")  # rolled back past: gone


def test_an_unknown_name_is_error_6401_and_changes_nothing() -> None:
    sp: Savepoints[str] = Savepoints()
    sp.save("x", "mark")
    with pytest.raises(SavepointNotFoundError) as err:
        sp.rollback_to("X")  # compared exactly
    assert err.value.code == 6401 and err.value.name == "X" and "6401" in str(err.value)
    assert isinstance(err.value, KBrokerError) and not err.value.retriable
    assert sp.names == ("x",)
    sp.discard_all()
    assert len(sp) == 0


@pytest.mark.parametrize("name", ["", "n" * (MAX_NAME + 1), None, 7, b"sp"])
def test_a_name_is_1_to_32_characters(name: object) -> None:
    with pytest.raises(InvalidArgumentError):
        check_name(name)
    sp: Savepoints[int] = Savepoints()
    with pytest.raises(InvalidArgumentError):
        sp.save(name, 0)  # type: ignore[arg-type]  # what a caller without types might pass
    assert check_name("n" * MAX_NAME) == "n" * MAX_NAME


NAMES = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("work"), st.integers(0, 99)),
        st.tuples(st.just("save"), NAMES),
        st.tuples(st.just("rollback"), NAMES),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_rolling_back_restores_the_state_saved_as_a_reference_model_says(ops: list[tuple[str, object]]) -> None:
    """The pending state is a list of work items; its mark is its length, as Held's records.
    A reference model keeps whole copies of the state per savepoint: after any sequence of work,
    SAVEs and rollbacks both agree on the state and on which names a rollback finds."""
    sp: Savepoints[int] = Savepoints()
    state: list[object] = []
    model: list[tuple[str, list[object]]] = []
    model_state: list[object] = []
    for op, arg in ops:
        if op == "work":
            state.append(arg)
            model_state.append(arg)
        elif op == "save":
            assert isinstance(arg, str)
            sp.save(arg, len(state))
            model.append((arg, list(model_state)))
        else:
            assert isinstance(arg, str)
            found = [i for i, (n, _) in enumerate(model) if n == arg]
            if not found:
                with pytest.raises(SavepointNotFoundError):
                    sp.rollback_to(arg)
            else:
                del state[sp.rollback_to(arg) :]
                i = found[-1]
                model_state = list(model[i][1])
                del model[i + 1 :]
        assert state == model_state
        assert sp.names == tuple(n for n, _ in model)


# --- a lease's records on a rollback to a savepoint --------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12))
def test_a_lease_keeps_what_it_took_before_the_savepoint_and_gives_back_the_rest_in_order(n: int, keep: int) -> None:
    keep = min(keep, n)
    taken = [rec("g", partition=i % 2, offset=100 + i) for i in range(n)]
    offsets = [b.position for b in taken]
    (kept, kept_offsets), back = rolled_back_to(taken, offsets, keep)
    assert kept == taken[:keep] and back == taken[keep:]
    assert kept_offsets == [b.position for b in kept]


def records_of(buf: GroupBuffer[FakeLease], group: str) -> list[int]:
    return [b.offset for b in buf.records(group)]


def test_records_put_back_stay_locked_for_their_holder_and_come_again_in_order() -> None:
    g = [rec("g", offset=i) for i in range(6)]
    buf = buffer_of(*g, rec("other", offset=50))
    me, someone = object(), object()
    lease, first = take(buf, me, top=2)
    assert lease is not None and [b.offset for b in first] == [0, 1]
    _, more = take(buf, me, top=2, lease=lease, group="g")
    assert [b.offset for b in more] == [2, 3]
    # ROLLBACK TRANSACTION to a savepoint taken after the first RECEIVE: 2 and 3 go back.
    (lease.taken, _), back = rolled_back_to(lease.taken, [b.position for b in lease.taken], 2)
    buf.put_back("g", back)
    assert records_of(buf, "g") == [2, 3, 4, 5] and buf.holder("g") is lease
    # Nobody else takes the group meanwhile: another transaction gets the other group only.
    other, got = take(buf, someone)
    assert [b.offset for b in got] == [50] and other is not None and other.owner is someone
    assert take(buf, someone, group="g") == (None, [])
    # Its holder's next RECEIVE gets them again, in order.
    _, again = take(buf, me, top=10, lease=lease, group="g")
    assert [b.offset for b in again] == [2, 3, 4, 5]
    assert buf.buffered == 0


def test_put_back_on_a_group_emptied_by_its_holder_and_released_later_makes_it_ready() -> None:
    buf = buffer_of(rec("g", offset=1), rec("g", offset=2))
    me = object()
    lease, got = take(buf, me)
    assert lease is not None and len(got) == 2
    buf.put_back("g", got)  # the whole RECEIVE was after the savepoint
    assert buf.pick(object(), NO_FULL) is None  # still locked
    buf.release(lease, "g")  # the transaction ends: the group is ready again, records in place
    assert buf.pick(object(), NO_FULL) == "g" and records_of(buf, "g") == [1, 2]
    assert all(isinstance(b, Buffered) and b.live(NOW_MS) for b in buf.records("g"))
