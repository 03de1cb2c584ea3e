"""Delayed delivery (core/transport/delayed.py): the mover's algorithm as a pure simulation, then
its parts. The simulation keeps a store's log (rows and the tombstones moves append, a takeover's
rows moved by a previous owner), a clock, rows sent at random moments and small memory budgets,
and drives a DelayedSchedule as kafka/transport/delayed_store.py does (read in log order, move only
once read to the ends, read again when exhausted, failed moves put back or read from the start):
every row is moved exactly once, never before its due time, within the budget, in a bounded number
of steps once all are due. Then due_time, DelayedDelivery, the record's encoding and every way
from_delayed refuses a record (and a fuzz: nothing but MalformedRecord), and the schedule's
order, replacement, partitions, byte accounting, horizon and second reads."""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport import delayed
from kbroker.core.transport.delayed import DelayedDelivery, DelayedMessage, DelayedSchedule, due_time, from_delayed
from kbroker.core.transport.message import MAX_EXPIRES_MS, TransportMessage, format_expires

TOPIC = "kbroker.ns.tdelayed.Sales"
T0 = 1_700_000_000_000
FATES = ["aborted", "unknown-committed", "unknown-lost", "reassign"]

# --- the mover, simulated ---------------------------------------------------------------------


def simulate(rows, budget, batch, per_step, tick, fates, seed) -> None:
    """rows: (due ms after T0, body bytes, partition, when): when -2 is in the log at the start
    and moved by a previous owner (its tombstone after the rows), -1 in the log at the start and
    waiting, n >= 0 sent at step n. fates: step -> what happens to that step's move (or a
    reassignment at its start)."""
    rng, fates = random.Random(seed), dict(fates)
    logs: list[list[tuple]] = [[], []]
    moves: Counter[bytes] = Counter()
    dues: dict[bytes, int] = {}

    def send(due: int, size: int, p: int) -> bytes:
        msg = TransportMessage(str(uuid.uuid4()), b"x" * size)
        _t, key, value, headers = delayed.delayed_record(TOPIC, msg, "Dest", due)
        logs[p].append((key, value, headers))
        dues[key] = due
        return key

    tombstones = []
    for due, size, p, when in rows:
        if when < 0:
            key = send(T0 + due, size, p)
            if when == -2:
                moves[key] += 1  # the previous owner's move
                tombstones.append((p, key))
    for p, key in tombstones:
        logs[p].append((key, None, None))
    later = sorted((r for r in rows if r[3] >= 0), key=lambda r: r[3])
    sched = DelayedSchedule(budget)
    pos, ends, now, step = [0, 0], None, T0, 0

    def mover_step() -> None:  # DelayedMover.step, with the log for Kafka
        nonlocal ends
        if fates.get(step) == "reassign":  # _on_assign
            sched.clear()
            pos[:], ends = [0, 0], None
        for _ in range(per_step):
            unread = [p for p in (0, 1) if pos[p] < len(logs[p])]
            if not unread:
                break
            p = rng.choice(unread)
            key, value, headers = logs[p][pos[p]]
            row = from_delayed(key, value, headers, p, pos[p])
            pos[p] += 1
            sched.remove(key) if row is None else sched.put(row)
            assert sched.held_bytes <= budget or len(sched) <= 1
            assert len(sched) or sched.held_bytes == 0
        if ends is None:
            ends = [len(log) if log else -1 for log in logs]
        if not all(end < 0 or pos[p] >= end for p, end in enumerate(ends)):
            return
        if sched.exhausted:
            sched.read_again({0: pos[0], 1: pos[1]})
            pos[:], ends = [0, 0], None
            return
        due = sched.pop_due(now, batch)
        if not due:
            return
        fate = fates.get(step, "ok")
        if fate in ("ok", "reassign", "unknown-committed"):
            for row in due:
                assert row.due_ms <= now, "moved before its due time"
                moves[row.key] += 1
                logs[row.partition].append((row.key, None, None))
        if fate == "aborted":
            for row in due:
                sched.put(row)
        elif fate.startswith("unknown"):  # _read_again(known=False)
            sched.clear()
            pos[:], ends = [0, 0], None

    last_due = T0 + max(r[0] for r in rows)
    pass_steps = (2 * len(rows)) // per_step + 3
    cap, quiet = (2 * len(rows) + 4) * pass_steps + len(rows), 0
    while True:
        while later and later[0][3] <= step:
            due, size, p, _ = later.pop(0)
            send(T0 + due, size, p)
        mover_step()
        step, now = step + 1, now + tick
        if later or now <= last_due:
            continue
        if set(moves) == set(dues) or quiet > cap:
            break
        quiet += 1
        fates.pop(step, None)  # failures only before all is due: then progress must be made
    assert set(moves) == set(dues), f"{len(dues) - len(moves)} rows never moved in {cap} steps"
    for _ in range(2 * pass_steps):  # nothing more is moved afterwards
        mover_step()
        step, now = step + 1, now + tick
    assert all(n == 1 for n in moves.values()), "a row moved twice"


def scenarios(due, distinct: bool):
    when = st.one_of(st.just(-2), st.just(-1), st.integers(0, 40))
    row = st.tuples(due, st.integers(0, 500), st.integers(0, 1), when)
    return dict(
        rows=st.lists(row, min_size=1, max_size=25, unique_by=(lambda r: r[0]) if distinct else None),
        budget=st.integers(300, 3000),  # a row holds 400-900 bytes: 0 to about 7 rows fit
        batch=st.integers(1, 4),
        per_step=st.integers(1, 6),
        tick=st.integers(1, 300),
        fates=st.dictionaries(st.integers(0, 40), st.sampled_from(FATES), max_size=4),
        seed=st.integers(0, 2**32),
    )


@settings(max_examples=200, deadline=None)
@given(**scenarios(st.integers(0, 4000), distinct=True))
def test_mover_moves_every_row_once_when_due_within_budget(rows, budget, batch, per_step, tick, fates, seed):
    simulate(rows, budget, batch, per_step, tick, fates, seed)


@settings(max_examples=150, deadline=None)  # more rows due at one time than fit: the horizon splits a tie
@example(rows=[(0, 0, 0, -1), (0, 0, 0, -1)], budget=400, batch=1, per_step=1, tick=1, fates={}, seed=0)
@given(**scenarios(st.integers(0, 4).map(lambda n: n * 1000), distinct=False))
def test_mover_with_equal_due_times(rows, budget, batch, per_step, tick, fates, seed):
    simulate(rows, budget, batch, per_step, tick, fates, seed)


# --- due_time and settings ----------------------------------------------------------------------

UTC1 = timezone(timedelta(hours=1))
NOON_2030 = 1893499200000  # 2030-01-01T12:00:00Z


@pytest.mark.parametrize(
    ("kwargs", "due"),
    [
        ({"delay": 1.5}, T0 + 1500),
        ({"delay": 0}, T0),
        ({"not_before": datetime(2030, 1, 1, 12)}, NOON_2030),  # no offset: UTC
        ({"not_before": datetime(2030, 1, 1, 13, tzinfo=UTC1)}, NOON_2030),
        ({"not_before": "2030-01-01T12:00:00Z"}, NOON_2030),
        ({"not_before": "2030-01-01T12:00:00"}, NOON_2030),
        ({"not_before": "2030-01-01T13:00:00.250+01:00"}, NOON_2030 + 250),
        ({"not_before": 1893499200.25}, NOON_2030 + 250),
        # Rounded up: never moved before the time named, by any fraction of a millisecond.
        ({"not_before": datetime(2030, 1, 1, 12, 0, 0, 250451, tzinfo=timezone.utc)}, NOON_2030 + 251),
        ({"not_before": datetime(2030, 1, 1, 12, 0, 0, 250001)}, NOON_2030 + 251),
        ({"not_before": "2030-01-01T12:00:00.250999Z"}, NOON_2030 + 251),
        ({"not_before": 1893499200.2501}, NOON_2030 + 251),
        ({"delay": 0.0015}, T0 + 2),
        ({"delay": 0.001}, T0 + 1),
        ({"not_before": datetime(2000, 1, 1, tzinfo=timezone.utc)}, 946684800000),  # passed: as is
        ({"not_before": format_expires(MAX_EXPIRES_MS)}, MAX_EXPIRES_MS),
        ({}, None),
    ],
)
def test_due_time(kwargs, due):
    assert due_time(T0, **kwargs) == due


def test_a_delay_counts_from_the_fraction_of_a_millisecond_it_was_sent_in():
    assert due_time(T0 + 0.4, delay=1) == T0 + 1001
    assert due_time(T0 + 0.0, delay=1) == T0 + 1000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delay": 1, "not_before": 5.0}, "not both"),
        *[({"delay": bad}, "delay") for bad in (-1, math.nan, math.inf, True, "5")],
        ({"delay": 1e15}, "9999"),
        ({"not_before": "9999-12-31T23:59:59-01:00"}, "9999"),
        ({"not_before": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2)))}, "9999"),
        ({"not_before": 1e13}, "9999"),
        *[({"not_before": bad}, "not_before") for bad in (-1, math.nan, True)],
        ({"not_before": "tomorrow"}, "ISO 8601"),
    ],
)
def test_due_time_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        due_time(T0, **kwargs)


def test_delayed_delivery_settings():
    assert DelayedDelivery() == DelayedDelivery(100, 1.0, 64 * 1024 * 1024)
    assert DelayedDelivery(1, 3600, 1).interval == 3600
    for bad in ({"batch_size": 0}, {"batch_size": True}, {"batch_size": 1.5}, {"budget": 0}, {"budget": "1"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DelayedDelivery(**bad)
    for interval in (0, -1, 3601, True, "1", math.nan, math.inf):
        with pytest.raises(ValueError, match="interval"):
            DelayedDelivery(interval=interval)


# --- the record ----------------------------------------------------------------------------------

TEXT = st.text(max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    body=st.one_of(st.none(), st.binary(max_size=64)),
    headers=st.dictionaries(TEXT, TEXT, max_size=4),
    correlation=st.one_of(st.none(), TEXT),
    reply_to=st.one_of(st.none(), TEXT),
    recoverable=st.booleans(),
    expires=st.one_of(st.none(), st.integers(0, MAX_EXPIRES_MS)),
    due=st.integers(0, MAX_EXPIRES_MS),
    destination=st.from_regex(r"[A-Za-z0-9_.-]{1,150}", fullmatch=True),
)
def test_record_round_trip(body, headers, correlation, reply_to, recoverable, expires, due, destination):
    msg = TransportMessage(str(uuid.uuid4()), body, headers, correlation, reply_to, recoverable, expires)
    topic, key, value, hs = delayed.delayed_record(TOPIC, msg, destination, due)
    assert topic == TOPIC and value is not None  # never a tombstone, even for a NULL body
    assert from_delayed(key, value, hs, 3, 7) == DelayedMessage(key, due, destination, msg, 3, 7)
    assert delayed.delayed_record(TOPIC, msg, destination, due)[1] != key  # a new row Id each time


def good(body: bytes | None = b"hi") -> tuple[bytes, bytes, list]:
    _t, key, value, headers = delayed.delayed_record(TOPIC, TransportMessage(str(uuid.uuid4()), body), "Dest", T0)
    return key, value, headers


def changed(headers: list, drop: str = "", **put: bytes | str | None) -> list:
    return [(k, v) for k, v in headers if k != drop and k not in put] + list(put.items())


def test_a_tombstone_and_header_forms():
    assert from_delayed(b"k", None, None) is None
    key, value, headers = good()
    text = [(k, v.decode()) for k, v in headers]  # another client's library gives text
    assert from_delayed(key, value, text).message.body == b"hi"
    key, value, headers = good(None)
    row = from_delayed(key, value, changed(headers, BodyNull=" TRUE "))
    assert row.message.body is None and row.destination == "Dest" and row.due_ms == T0


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda k, v, h: (None, v, h), "no key"),
        (lambda k, v, h: (b"", None, h), "no key"),
        (lambda k, v, h: (k, v, changed(h, drop=delayed.H_DUE)), "missing header Due"),
        (lambda k, v, h: (k, v, changed(h, drop=delayed.H_DESTINATION)), "missing header Destination"),
        (lambda k, v, h: (k, v, changed(h, Due=b"soon")), "ISO 8601"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"no spaces")), "transport address"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"")), "transport address"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"q" * 151)), "transport address"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"Dest\n")), "transport address"),  # not before a newline
        (lambda k, v, h: (k, v, changed(h, Destination=b"Dest@no spaces")), "transport address"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"Dest@")), "transport address"),
        (lambda k, v, h: (k, v, changed(h, BodyNull=b"maybe")), "BodyNull"),
        (lambda k, v, h: (k, b"x", changed(h, BodyNull=b"true")), "has a body"),
        (lambda k, v, h: (k, v, h + [(delayed.H_DUE, format_expires(T0).encode())]), "twice"),
        (lambda k, v, h: (k, v, changed(h, Due=b"\xff")), "UTF-8"),
        (lambda k, v, h: (k, v, changed(h, Destination=b"\xfe")), "UTF-8"),
        (lambda k, v, h: (k, v, changed(h, drop="Id")), "Id"),
        (lambda k, v, h: (k, v, changed(h, drop="Recoverable")), "Recoverable"),
        (lambda k, v, h: (k, v, changed(h, drop="Headers")), "Headers"),
    ],
)
def test_from_delayed_refuses(edit, match):
    with pytest.raises(MalformedRecord, match=match):
        from_delayed(*edit(*good()))


NAMES = st.sampled_from(
    ["Due", "Destination", "BodyNull", "Id", "Recoverable", "Headers", "CorrelationId", "Expires", "x"]
)
VALUES = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.text(max_size=24),
    st.sampled_from(["true", b"FALSE", "1", "Dest", b"{}", '{"a": "b"}', "[1]", str(uuid.UUID(int=5))]),
    st.integers(-62135596800000, MAX_EXPIRES_MS).map(lambda ms: format_expires(ms).encode()),
)


@settings(max_examples=400, deadline=None)
@given(
    key=st.one_of(st.none(), st.binary(max_size=4)),
    value=st.one_of(st.none(), st.binary(max_size=4)),
    base=st.booleans(),
    extra=st.lists(st.tuples(NAMES, VALUES), max_size=8),
    drop=st.sets(NAMES, max_size=2),
)
def test_from_delayed_fuzz(key, value, base, extra, drop):
    headers = [(k, v) for k, v in (good()[2] if base else []) if k not in drop] + extra
    try:
        row = from_delayed(key, value, headers)
    except MalformedRecord:
        return
    assert row is None or (isinstance(row, DelayedMessage) and row.key == key and isinstance(row.due_ms, int))


# --- the schedule --------------------------------------------------------------------------------


def row(key: bytes, due: int, partition: int = 0, offset: int = 0) -> DelayedMessage:
    return DelayedMessage(key, due, "Dest", TransportMessage(str(uuid.uuid4()), b""), partition, offset)


SIZE = row(b"k", 0).size  # every row above: 400 bytes


def test_pop_due_earliest_first_within_the_limit():
    s = DelayedSchedule()
    for key, due, offset in ((b"a", 30, 0), (b"b", 10, 5), (b"c", 20, 1), (b"d", 10, 2), (b"e", 99, 3)):
        s.put(row(key, due, offset=offset))
    assert s.next_due() == 10 and len(s) == 5
    assert [r.key for r in s.pop_due(25, limit=2)] == [b"d", b"b"]  # equal due times: by offset
    assert [r.key for r in s.pop_due(25, limit=5)] == [b"c"]
    assert s.pop_due(25) == [] and s.next_due() == 30
    assert [r.key for r in s.pop_due(99)] == [b"a", b"e"] and s.held_bytes == 0 and s.next_due() is None


def test_replace_and_remove_by_key():
    s = DelayedSchedule()
    s.put(row(b"a", 10))
    s.put(DelayedMessage(b"a", 50, "Dest", TransportMessage(str(uuid.uuid4()), b"12345"), 0, 1))
    assert len(s) == 1 and s.held_bytes == SIZE + 5 and s.pop_due(20) == [] and s.next_due() == 50
    s.remove(b"nope")
    s.remove(b"a")
    assert len(s) == 0 and s.held_bytes == 0 and s.next_due() is None and s.pop_due(10**6) == []


def test_drop_partitions():
    s = DelayedSchedule()
    for i in range(9):
        s.put(row(b"r%d" % i, i, partition=i % 3))
    s.drop_partitions({0, 2})
    assert len(s) == 3 and s.held_bytes == 3 * SIZE
    assert [(r.key, r.partition) for r in s.pop_due(100)] == [(b"r1", 1), (b"r4", 1), (b"r7", 1)] and not s.held_bytes


def test_horizon_and_budget():
    s = DelayedSchedule(budget=2 * SIZE)
    s.put(row(b"a", 10))
    s.put(row(b"b", 20))
    assert s.horizon is None and s.held_bytes == 2 * SIZE
    s.put(row(b"c", 30))  # does not fit: the latest-due goes
    assert s.horizon == 30 and len(s) == 2
    s.put(row(b"d", 5))
    assert s.horizon == 20 and [r.key for r in s.pop_due(10**6, 1)] == [b"d"]
    s.put(row(b"e", 20))  # due at the horizon: left for a second read, even with room
    s.put(row(b"f", 25))
    assert len(s) == 1 and s.held_bytes == SIZE and not s.exhausted
    assert [r.key for r in s.pop_due(10**6)] == [b"a"] and s.exhausted and s.held_bytes == 0
    big = DelayedSchedule(budget=10)
    big.put(row(b"x", 10))  # one row larger than the budget is held alone
    assert len(big) == 1 and big.held_bytes == SIZE and big.horizon is None
    big.put(row(b"y", 5))
    assert [r.key for r in big.pop_due(100)] == [b"y"] and big.horizon == 10


def test_read_again_skips_the_rows_moved():
    s = DelayedSchedule(budget=SIZE)
    s.put(row(b"a", 10, offset=0))
    s.put(row(b"b", 20, offset=1))
    assert s.horizon == 20 and [r.key for r in s.pop_due(100)] == [b"a"] and s.exhausted
    s.read_again({0: 2})
    assert s.horizon is None and not s.exhausted and len(s) == 0
    s.put(row(b"a", 10, offset=0))  # before the horizon and the ends: moved
    assert len(s) == 0
    # held: at the horizon (dropped last time), past the ends (new since), a partition the read did not reach
    for kept in (row(b"b", 20, offset=1), row(b"n", 5, offset=2), row(b"p", 5, partition=1)):
        s.put(kept)
        assert s.pop_due(100) == [kept]
    assert s.horizon is None
    s.clear()  # an assignment: nothing skipped any more
    s.put(row(b"a", 10, offset=0))
    assert len(s) == 1 and s.horizon is None
    fresh = DelayedSchedule()
    fresh.read_again({0: 9})  # no horizon: nothing was dropped, nothing to skip
    fresh.put(row(b"a", 10, offset=0))
    assert len(fresh) == 1
