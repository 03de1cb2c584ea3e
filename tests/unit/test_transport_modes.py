"""The transaction modes' names (core/transport/transaction_modes.py) and the outbox's encoding
of the messages it stores (sdk/transport/outbox.py, with an in-memory SQLite database)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.sdk.transport.outbox import Outbox, _decode, _encode


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("SendsAtomicWithReceive", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE),
        ("receive_only", TransactionMode.RECEIVE_ONLY),
        ("NONE", TransactionMode.NONE),
        (TransactionMode.RECEIVE_ONLY, TransactionMode.RECEIVE_ONLY),
    ],
)
def test_a_mode_is_named_as_nservicebus_names_it(text: str, mode: TransactionMode) -> None:
    assert TransactionMode.of(text) is mode


def test_an_unknown_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="SendsAtomicWithReceive, ReceiveOnly, None"):
        TransactionMode.of("TransactionScope")


records = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=20),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=200)),
        st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=5),
    ),
    max_size=10,
)


@given(records)
def test_the_stored_messages_come_back_as_they_went_in(rs: list) -> None:
    assert _decode(_encode(rs)) == [(t, k, v, list(h)) for t, k, v, h in rs]


def test_rows_are_stored_read_marked_and_cleaned() -> None:
    outbox = Outbox(sa.create_engine("sqlite://"), keep=60.0)
    with outbox.begin() as conn:
        assert outbox.get(conn, "Billing", "m1") is None
        outbox.store(conn, "Billing", "m1", [("t", b"k", b"v", [("h", b"1")])], "Billing:0:5")
    with outbox.begin() as conn:
        got = outbox.get(conn, "Billing", "m1")
    assert got is not None and got.records == [("t", b"k", b"v", [("h", b"1")])]
    assert (got.dispatched, got.source) == (False, "Billing:0:5")
    assert outbox.clean() == 0  # not dispatched: kept
    outbox.dispatched("Billing", "m1")
    assert outbox.clean() == 0  # dispatched now: kept for `keep`
    assert outbox.clean(now=1e12) == 1 and outbox.rows() == []
    with outbox.begin() as conn, pytest.raises(sa.exc.IntegrityError):  # one row per message
        outbox.store(conn, "Billing", "m2", [], "a")
        outbox.store(conn, "Billing", "m2", [], "b")
