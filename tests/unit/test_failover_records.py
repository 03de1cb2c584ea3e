"""The failover bench's handlings (bench/failover.handling): whatever the output queue or a log
line holds, a handling or None, never an exception."""

import json

from hypothesis import given
from hypothesis import strategies as st

from kbroker.bench.failover import analyse, handling

VALID = {"n": 3, "by": "r0", "p": 1, "t": 12.5}


@given(st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=200)))
def test_any_bytes_are_a_handling_or_none(raw):
    r = handling(raw)
    assert r is None or isinstance(r, dict)


def test_only_whole_handlings_count():
    assert handling(json.dumps(VALID).encode()) == VALID
    for bad in (b"", b"\xff\xfe", b"[]", b"{}", b'{"n": "3", "by": "r0", "p": 1, "t": 1}',
                json.dumps({**VALID, "p": True}), json.dumps({**VALID, "by": None}),
                json.dumps({k: v for k, v in VALID.items() if k != "t"}), '{"n": 1, "by": "r0"'):
        assert handling(bad) is None, bad


def test_the_analysis_of_the_handlings_kept_counts_each_input_once():
    records = [handling(json.dumps({"n": i, "by": "r0" if i < 5 else "r2", "p": 0, "t": float(i)}))
               for i in range(10)]
    result = analyse([r for r in records if r is not None], 10, killed_at=4.5, victim="r0")
    assert (result["missing"], result["duplicated"], result["gap_s"]) == (0, 0, 1.0)
