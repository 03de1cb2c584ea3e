"""The failover bench's handlings (bench/failover.handling): whatever the output queue or a log
line holds, a handling or None, never an exception."""

import json

from hypothesis import given
from hypothesis import strategies as st

from kbroker.bench.failover import analyse, handling, held_at
from kbroker.bench.failover import owned as owned_by

VALID = {"n": 3, "by": "r0", "p": 1, "t": 12.5}


@given(st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=200)))
def test_any_bytes_are_a_handling_or_none(raw):
    r = handling(raw)
    assert r is None or isinstance(r, dict)


def test_only_whole_handlings_count():
    assert handling(json.dumps(VALID).encode()) == VALID
    for bad in (
        b"",
        b"\xff\xfe",
        b"[]",
        b"{}",
        b'{"n": "3", "by": "r0", "p": 1, "t": 1}',
        json.dumps({**VALID, "p": True}),
        json.dumps({**VALID, "by": None}),
        json.dumps({k: v for k, v in VALID.items() if k != "t"}),
        '{"n": 1, "by": "r0"',
    ):
        assert handling(bad) is None, bad


def test_the_analysis_of_the_handlings_kept_counts_each_input_once():
    records = [handling(json.dumps({"n": i, "by": "r0" if i < 5 else "r2", "p": 0, "t": float(i)})) for i in range(10)]
    result = analyse([r for r in records if r is not None], 10, killed_at=4.5, victim="r0")
    assert (result["missing"], result["duplicated"], result["gap_s"]) == (0, 0, 1.0)


def test_a_partition_the_killed_reader_held_but_never_handled_counts_as_its():
    """A rebalance gave partition 1 to r0 shortly before the kill; r0 handled nothing of it. It is
    one of the killed reader's partitions (from what r0 reported holding), not a move between two
    live readers when r2 takes it after the kill."""
    rows = [
        (0, "r0", 0, 1.0),
        (1, "r1", 1, 1.5),
        (2, "r0", 0, 2.0),
        (3, "r1", 1, 2.5),
        (4, "r2", 0, 6.0),
        (5, "r2", 1, 6.5),
    ]
    records = [{"n": n, "by": by, "p": p, "t": t} for n, by, p, t in rows]
    without = analyse(records, 6, killed_at=4.0, victim="r0")
    assert (without["victim_partitions"], without["moves"]) == ([0], [2.5])
    result = analyse(records, 6, killed_at=4.0, victim="r0", victim_held=[0, 1])
    assert result["victim_partitions"] == [0, 1] and result["moves"] == []
    assert result["gap_s"] == 4.0 and (result["missing"], result["duplicated"]) == (0, 0)


def test_what_a_reader_held_at_a_moment_is_its_last_report_before_it(tmp_path):
    owned = tmp_path / "r1"
    owned.write_text(
        "".join(
            json.dumps({"t": t, "partitions": ps, "expelled": 0}) + "\n"
            for t, ps in ((1.0, [0, 1, 2]), (3.0, [1, 2]), (5.0, []))
        )
    )
    reports = owned_by(tmp_path)
    assert (
        held_at(reports["r1"], 0.5),
        held_at(reports["r1"], 2.0),
        held_at(reports["r1"], 4.0),
        held_at(reports["r1"], 9.0),
    ) == ([], [0, 1, 2], [1, 2], [])
    assert held_at(reports["r0"], 4.0) == []
