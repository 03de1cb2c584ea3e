"""A kbroker transaction's states (core/txn/state.py): every transition allowed and refused, the
text each state says of itself, and that no sequence of allowed transitions leaves an end."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.txn.state import TRANSITIONS, TransactionState
from kbroker.errors import TransactionStateError

S = TransactionState
ALLOWED = {(S.OPEN, S.COMMITTED), (S.OPEN, S.ABORTED), (S.OPEN, S.IN_DOUBT), (S.OPEN, S.ROLLED_BACK)}


@pytest.mark.parametrize("source, target", list(itertools.product(S, S)))
def test_every_transition_is_allowed_or_refused_as_listed(source, target):
    allowed = (source, target) in ALLOWED
    assert source.is_transition_valid(target) is allowed
    if allowed:
        assert source.to(target) is target
    else:
        with pytest.raises(TransactionStateError, match=f"^the transaction is already {source.value}$"):
            source.to(target)


def test_the_table_names_every_state_and_only_open_goes_anywhere():
    assert set(TRANSITIONS) == set(S)
    assert [s for s in S if not s.terminal] == [S.OPEN]


def test_each_state_says_what_the_transaction_said_before():
    assert [s.value for s in S] == ["open", "committed", "aborted", "in doubt", "rolled back"]
    assert S.ROLLED_BACK == "rolled back" and f"{S.IN_DOUBT}" == "in doubt" and str(S.OPEN) == "open"


@given(st.sampled_from(list(S)), st.lists(st.sampled_from(list(S)), max_size=20))
def test_no_sequence_of_allowed_transitions_leaves_an_end(start, targets):
    state = start
    ended = state.terminal
    for target in targets:
        if not state.is_transition_valid(target):
            continue
        assert not ended, f"{state} moved on to {target}"
        state = target
        ended = ended or state.terminal
    assert ended == state.terminal
