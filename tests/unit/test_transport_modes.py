"""The transaction modes' names (core/transport/transaction_modes.py), the outbox's encoding of
the messages it stores and what a row dispatches (core/transport/outbox_rows.py), and its table
(sdk/transport/outbox.py and the asyncio one, sdk/transport/aio_outbox.py, on SQLite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import create_async_engine

from kbroker.core.transport.outbox_rows import Stored, decode, encode, to_dispatch
from kbroker.core.transport.transaction_modes import TransactionMode
from kbroker.sdk.transport.aio_outbox import AsyncOutbox
from kbroker.sdk.transport.outbox import Outbox


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
    assert decode(encode(rs)) == [(t, k, v, list(h)) for t, k, v, h in rs]


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


def test_what_a_row_dispatches_its_own_sends_a_crashed_ones_or_nothing_for_a_duplicate() -> None:
    counted: list[str] = []
    fresh = [("t", None, b"new", [])]
    old = [("t", None, b"stored", [])]
    assert to_dispatch(None, fresh, "Q:0:5", counted.append) == (fresh, True) and counted == []
    back = Stored(old, dispatched=False, source="Q:0:5")  # this record, back after a crash
    assert to_dispatch(back, fresh, "Q:0:5", counted.append) == (old, True)
    other = Stored(old, dispatched=False, source="Q:1:9")  # another copy's row, not yet dispatched
    assert to_dispatch(other, fresh, "Q:0:5", counted.append) == ([], False)
    gone = Stored(old, dispatched=True, source="Q:0:5")  # dispatched: a duplicate of this record
    assert to_dispatch(gone, fresh, "Q:0:5", counted.append) == ([], False)
    assert counted == ["outbox_recovered", "duplicates_dropped", "duplicates_dropped"]


def test_the_asyncio_outbox_keeps_the_same_rows(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"

    async def run() -> list[dict]:
        outbox = AsyncOutbox(create_async_engine(url), keep=60.0)
        await outbox.setup()
        await outbox.setup()  # once is enough; again changes nothing
        async with outbox.begin() as conn:
            assert await outbox.get(conn, "Billing", "m1") is None
            await outbox.store(conn, "Billing", "m1", [("t", b"k", b"v", [("h", b"1")])], "Billing:0:5")
        async with outbox.begin() as conn:
            got = await outbox.get(conn, "Billing", "m1")
        assert got == Stored([("t", b"k", b"v", [("h", b"1")])], False, "Billing:0:5")
        assert await outbox.clean() == 0
        await outbox.dispatched("Billing", "m1")
        assert await outbox.clean() == 0
        rows = await outbox.rows()
        assert await outbox.clean(now=1e12) == 1 and await outbox.rows() == []
        await outbox.engine.dispose()
        return rows

    rows = asyncio.run(run())
    assert [(r["endpoint"], r["message_id"]) for r in rows] == [("Billing", "m1")]
    assert rows[0]["dispatched_at"] is not None
    # The thread endpoint's Outbox reads the same table the asyncio one wrote.
    sync = Outbox(sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}"))
    assert sync.rows() == []
