"""Which records reclaiming may delete (core/receive/reclaim.py), and the DescribeLogDirs answer that
gives a queue's bytes (kafka/wire.py), without a broker."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.receive.reclaim import (
    ANALYTICS_HOLD_SECONDS,
    CLOCK_SKEW_SECONDS,
    analytics_floor,
    lowest,
    reclaim_points,
)
from kbroker.kafka.wire import describe_log_dirs_request, parse_describe_log_dirs


def test_received_records_below_the_commit_go():
    assert reclaim_points({0: 0, 1: 10}, {0: 7, 1: 12}) == {0: 7, 1: 12}


def test_a_partition_nobody_committed_on_keeps_everything():
    assert reclaim_points({0: 0, 1: 0}, {0: None}) == {}
    assert reclaim_points({0: 0}, {0: -1001}) == {}  # an offset that is no offset


def test_nothing_to_do_at_or_below_the_log_start():
    assert reclaim_points({0: 9}, {0: 9}) == {}
    assert reclaim_points({0: 9}, {0: 4}) == {}  # the log start already passed the commit


def test_a_retained_conversation_holds_the_prefix():
    assert reclaim_points({0: 0, 1: 0}, {0: 50, 1: 50}, keep_from={0: 20, 1: 60}) == {0: 20, 1: 50}
    assert reclaim_points({0: 20}, {0: 50}, keep_from={0: 20}) == {}


offsets = st.integers(min_value=0, max_value=10**6)


@given(
    st.dictionaries(st.integers(0, 8), st.tuples(offsets, st.one_of(st.none(), offsets), st.one_of(st.none(), offsets)))
)
def test_never_past_the_commit_or_a_retained_record(parts):
    starts = {p: s for p, (s, _, _) in parts.items()}
    committed = {p: c for p, (_, c, _) in parts.items()}
    keep = {p: k for p, (_, _, k) in parts.items() if k is not None}
    for p, upto in reclaim_points(starts, committed, keep).items():
        c = committed[p]
        assert c is not None and starts[p] < upto <= c
        assert p not in keep or upto <= keep[p]


# --- the analytics job's read position (docs/analytics.md) -------------------------------------

NOW_MS = 1_764_000_000_000


def test_a_recent_analytics_position_lowers_the_reclaim_point():
    floor = analytics_floor({0: (30, str(NOW_MS - 5_000)), 1: (80, str(NOW_MS))}, NOW_MS)
    assert floor == {0: 30, 1: 80}
    keep = lowest({0: 20}, floor)  # a retained conversation needs 20 on partition 0
    assert keep == {0: 20, 1: 80}
    assert reclaim_points({0: 0, 1: 0}, {0: 50, 1: 50}, keep_from=keep) == {0: 20, 1: 50}


def test_an_analytics_position_older_than_the_hold_holds_nothing_back():
    assert ANALYTICS_HOLD_SECONDS == 3600.0
    hold_ms = 3_600_000
    positions = {0: (30, str(NOW_MS - hold_ms - 1)), 1: (40, str(NOW_MS - 2 * hold_ms))}
    assert analytics_floor(positions, NOW_MS) == {}  # a job that stopped an hour ago
    assert analytics_floor({0: (30, str(NOW_MS - hold_ms))}, NOW_MS) == {0: 30}  # exactly at the hold: held
    assert analytics_floor({0: (30, str(NOW_MS - 11_000))}, NOW_MS, hold_s=10.0) == {}
    assert reclaim_points({0: 0, 1: 0}, {0: 50, 1: 50}, keep_from=analytics_floor(positions, NOW_MS)) == {0: 50, 1: 50}


def test_while_the_job_runs_a_partition_it_has_no_position_for_keeps_everything():
    """A queue the job's Spark source has not found yet, or found in a first batch that knew no
    end offsets: reclaimed under the job, its records were never counted."""
    topics = {
        ("q.Fresh", 0): (-1001, None),
        ("q.Fresh", 1): (-1001, ""),
        ("q.Stale", 0): (12, str(NOW_MS - 2_000)),
        ("q.Stale", 1): (7, str(NOW_MS - 7_200_000)),
    }
    floor = analytics_floor(topics, NOW_MS)
    assert floor == {("q.Fresh", 0): 0, ("q.Fresh", 1): 0, ("q.Stale", 0): 12, ("q.Stale", 1): 0}
    fresh = {p: o for (t, p), o in floor.items() if t == "q.Fresh"}
    assert reclaim_points({0: 0, 1: 3}, {0: 10, 1: 10}, keep_from=fresh) == {}
    # No job at all (no position anywhere): the queue readers' commits alone decide.
    assert analytics_floor({("q.Fresh", 0): (-1001, None)}, NOW_MS) == {}


def test_an_analytics_position_without_a_timestamp_holds_nothing_back():
    positions = {0: (30, None), 1: (30, ""), 2: (30, "not a time"), 3: (-1001, str(NOW_MS))}
    assert analytics_floor(positions, NOW_MS) == {}
    assert reclaim_points(
        {p: 0 for p in range(4)}, {p: 50 for p in range(4)}, keep_from=analytics_floor(positions, NOW_MS)
    ) == {0: 50, 1: 50, 2: 50, 3: 50}


def test_a_position_stamped_in_the_future_holds_nothing_back():
    """Anyone who may commit for the job's group could stamp a position far ahead and hold every
    record for ever; a stamp past the clocks' skew is not the job's."""
    skew = int(CLOCK_SKEW_SECONDS * 1000)
    assert analytics_floor({0: (30, str(NOW_MS + skew + 1)), 1: (40, str(NOW_MS + 10**12))}, NOW_MS) == {}
    assert analytics_floor({0: (30, str(NOW_MS + skew))}, NOW_MS) == {0: 30}  # within the skew: the job's


def test_lowest_takes_the_lowest_floor_naming_each_partition():
    assert lowest() == {}
    assert lowest(None, {}) == {}
    assert lowest({0: 5, 1: 9}, None, {1: 3, 2: 7}, {0: 6}) == {0: 5, 1: 3, 2: 7}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def response(correlation_id: int, dirs: list[tuple[int, str, dict[str, list[tuple[int, int, bool]]]]]) -> bytes:
    """A DescribeLogDirs v1 response body as a broker writes it."""
    out = struct.pack(">ii", correlation_id, 0) + struct.pack(">i", len(dirs))
    for error, path, topics in dirs:
        out += struct.pack(">h", error) + _string(path) + struct.pack(">i", len(topics))
        for name, partitions in topics.items():
            out += _string(name) + struct.pack(">i", len(partitions))
            for partition, size, future in partitions:
                out += struct.pack(">iqqb", partition, size, 0, future)
    return out


sizes = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 2**40), st.booleans()), max_size=6)


@given(
    st.lists(st.tuples(st.sampled_from([0, 57]), st.dictionaries(st.sampled_from(["q", "other"]), sizes)), max_size=3)
)
def test_log_dir_sizes_add_up_per_partition(dirs):
    payload = response(7, [(error, f"/d{i}", topics) for i, (error, topics) in enumerate(dirs)])
    expected: dict[int, int] = {}
    for error, topics in dirs:
        for partition, size, future in topics.get("q", []):
            if not error and not future:
                expected[partition] = expected.get(partition, 0) + size
    assert parse_describe_log_dirs(payload, "q", correlation_id=7) == expected


def test_the_request_names_the_topic_and_its_partitions():
    request = describe_log_dirs_request("kbroker.ns.queue.Q", [0, 3])
    size, api_key, version = struct.unpack_from(">ihh", request)
    assert (size, api_key, version) == (len(request) - 4, 35, 1)
    assert request.endswith(_string("kbroker.ns.queue.Q") + struct.pack(">iii", 2, 0, 3))
