"""The analytics job's pure state (core/analytics/queue_analytics.py, docs/analytics.md): arrivals, receive
progress, backlog and stale gauges, top groups, dialog classes and their RECLASSIFY commands,
window closing, and the replay property that lets a restarted job count nothing twice."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.analytics.analytics_model import Arrival, Output, Progress
from kbroker.core.analytics.queue_analytics import Analytics, dialog_row_at
from kbroker.core.dialogs.groups import MOVE_MARKER

ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
MSG = "//app/Request"
W = 60_000  # the default window, ms
T = 600_000  # a window start (a multiple of W), so times below read as "T + ms into the window"


def arr(
    offset: int,
    ts: int,
    *,
    partition: int = 0,
    conv: str = "c1",
    side: str = "TARGET",
    group: str = "g1",
    mtype: str = MSG,
    rekeyed_from: str | None = None,
    queue: str = "Q",
) -> Arrival:
    return Arrival(
        queue, partition, offset, ts, f"m-{queue}-{partition}-{offset}", conv, side, group, mtype, rekeyed_from
    )


def snap(
    at: int, committed: int = -1, completed: tuple[int, ...] = (), *, partition: int = 0, queue: str = "Q"
) -> Progress:
    return Progress(queue, at, ((partition, committed, frozenset(completed)),))


def windows(out: Output) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in out.analytics if k.startswith("queue/")}


def dialogs(out: Output) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in out.analytics if k.startswith("dialog/")}


def roundtrip(a: Analytics, **settings: Any) -> Analytics:
    """Saved and restored the way the job does it (orjson through the state files)."""
    return Analytics.from_dict(orjson.loads(orjson.dumps(a.to_dict())), "ns", **settings)


# --- arrivals and gauges -----------------------------------------------------------------------


def test_arrivals_are_counted_in_the_window_of_their_record_timestamp():
    a = Analytics("ns")
    for offset, ts in enumerate([T + 1_000, T + 59_999, T + 60_000, T + 125_000]):
        a.arrival(arr(offset, ts))
    rows = windows(a.report(0))
    assert sorted(rows) == [f"queue/Q/{T}", f"queue/Q/{T + 60_000}", f"queue/Q/{T + 120_000}"]
    assert [rows[f"queue/Q/{T + s}"]["arrivals"] for s in (0, 60_000, 120_000)] == [2, 1, 1]
    first = rows[f"queue/Q/{T}"]
    assert (first["kind"], first["namespace"], first["queue"]) == ("queue_window", "ns", "Q")
    assert (first["window_start"], first["window_end"], first["window_s"]) == (T, T + 60_000, 60.0)
    assert (first["as_of"], first["batch"], first["receives"]) == (T + 125_000, 0, 0)


def test_backlog_age_and_stale_counts_at_the_jobs_clock():
    a = Analytics("ns", stale_after_s=30.0)
    a.stale_after["Q"] = 12.0  # Q's own threshold; R keeps the default
    now = T + 59_000
    ages_s = [59, 39, 14, 10, 7, 1]  # 10: exactly at the dispatcher's threshold
    for offset, age in enumerate(ages_s):
        a.arrival(arr(offset, now - age * 1000))
        a.arrival(arr(offset, now - age * 1000, queue="R", conv="r1"))
    a.progress(snap(now))  # the clock: nothing received
    rows = windows(a.report(3))
    q, r = rows[f"queue/Q/{T}"], rows[f"queue/R/{T}"]
    assert (q["backlog"], q["oldest_unreceived_age_s"], q["as_of"]) == (6, 59.0, now)
    assert q["stale"] == {"dispatcher_10s": 4, "forwarder_60s": 0, "queue": 3}  # >= 12 s: 59, 39, 14
    assert q["stale_after_s"] == 12.0
    assert r["stale"] == {"dispatcher_10s": 4, "forwarder_60s": 0, "queue": 2}  # >= 30 s: 59, 39
    assert r["stale_after_s"] == 30.0
    a.progress(snap(now + 3_000))  # three seconds on: ages 62, 42, 17, 13, 10, 4
    rows = windows(a.report(4))
    assert rows[f"queue/Q/{T + 60_000}"]["stale"] == {"dispatcher_10s": 5, "forwarder_60s": 1, "queue": 4}
    assert rows[f"queue/Q/{T + 60_000}"]["oldest_unreceived_age_s"] == 62.0


def test_an_empty_queue_has_no_oldest_age():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000, committed=1))
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"], row["oldest_unreceived_age_s"]) == (1, 1, 0, None)
    assert row["top_groups"] == []


# --- receive progress --------------------------------------------------------------------------


def test_a_snapshot_removes_exactly_the_covered_offsets_out_of_order():
    a = Analytics("ns")
    for offset in range(6):
        a.arrival(arr(offset, T + 1_000 * (offset + 1)))
    a.progress(snap(T + 70_000, committed=2, completed=(4,)))  # received: 0, 1, 4
    assert a.backlog("Q") == 3
    rows = windows(a.report(0))
    assert (rows[f"queue/Q/{T}"]["arrivals"], rows[f"queue/Q/{T}"]["receives"]) == (6, 0)
    now_row = rows[f"queue/Q/{T + 60_000}"]
    assert (now_row["arrivals"], now_row["receives"], now_row["backlog"]) == (0, 3, 3)
    assert now_row["oldest_unreceived_age_s"] == 67.0  # offset 2 arrived at T + 3 s
    a.progress(snap(T + 80_000, committed=3, completed=(5,)))  # 2 and 5 now; 4 was counted already
    assert a.backlog("Q") == 1
    now_row = windows(a.report(1))[f"queue/Q/{T + 60_000}"]
    assert (now_row["receives"], now_row["backlog"], now_row["oldest_unreceived_age_s"]) == (5, 1, 76.0)
    assert now_row["top_groups"] == [{"group": "g1", "backlog": 1, "oldest_age_s": 76.0}]


def test_receives_land_in_the_window_of_the_snapshot_time():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(0, T + 65_000, queue="R"))  # another queue's record, read ahead of the snapshot
    a.progress(snap(T + 50_000, committed=1))  # Q's offset 0 was received by T + 50 s
    rows = windows(a.report(0))
    assert rows[f"queue/Q/{T}"]["receives"] == 1
    assert rows[f"queue/Q/{T + 60_000}"]["receives"] == 0


def test_a_snapshot_ahead_of_the_records_counts_them_received_never_backlog():
    a = Analytics("ns")
    a.progress(snap(T + 5_000, committed=2, completed=(3,)))  # Spark read progress before the queue
    for offset in range(4):
        a.arrival(arr(offset, T + 1_000 + offset))
    assert a.backlog("Q") == 1  # only offset 2
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"]) == (4, 3, 1)
    assert row["oldest_unreceived_age_s"] == 3.998  # offset 2, from T + 1.002 s to T + 5 s


def test_a_record_seen_twice_is_counted_once():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(1, T + 2_000))
    a.arrival(arr(1, T + 2_000))
    a.arrival(arr(0, T + 1_000))  # below the highest taken: seen already
    a.arrival(arr(0, T + 1_000, partition=1))  # the same offset of another partition is another record
    a.progress(snap(T + 3_000, committed=1))
    a.arrival(arr(0, T + 1_000))  # again, after it was received
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"]) == (3, 1, 2)


def test_records_whose_timestamps_go_backwards_are_all_counted():
    # Several producers SEND to one partition: the broker appends in an order their timestamps do
    # not follow, and the job feeds a batch in timestamp order (issue 22, case 3).
    a = Analytics("ns")
    for offset, ts in sorted(enumerate([T + 5_000, T + 4_000, T + 3_000, T + 6_000]), key=lambda r: r[1]):
        a.arrival(arr(offset, ts))
    a.progress(snap(T + 7_000, committed=1))  # offset 0 received
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"]) == (4, 1, 3)
    a.arrival(arr(2, T + 3_000))  # a later batch read an offset of the first again: seen already
    a.arrival(arr(4, T + 1_000))  # the next batch's record, older than all of them: new
    row = windows(a.report(1))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["backlog"]) == (5, 4)


@st.composite
def partition_logs(draw: st.DrawFn) -> tuple[list[list[Arrival]], int]:
    """What Spark reads of a queue's partitions, batch by batch: each batch takes the next offsets of
    every partition (offsets with gaps, as transaction markers leave), in any order and with any
    timestamps, plus records of earlier batches read again; and the committed offset of partition 0
    a snapshot shows at the end."""
    logs = []
    for partition in range(draw(st.integers(1, 3))):
        gaps = draw(st.lists(st.integers(1, 3), max_size=30))
        offsets = [sum(gaps[:i]) for i in range(len(gaps))]
        logs.append([arr(o, T + draw(st.integers(0, 50_000)), partition=partition, conv=f"c{o % 3}") for o in offsets])
    batches: list[list[Arrival]] = []
    taken: list[Arrival] = []
    while any(logs):
        batch = []
        for log in logs:
            n = draw(st.integers(0, len(log)))
            batch += log[:n]
            del log[:n]
        again = draw(st.lists(st.sampled_from(taken), max_size=3)) if taken else []
        taken += batch
        batches.append(draw(st.permutations(batch + again)))
    committed = draw(st.integers(-1, 60))
    return batches, committed


@settings(max_examples=200, deadline=None)
@given(partition_logs())
def test_every_offset_is_counted_once_whatever_the_timestamps(run):
    batches, committed = run
    a = Analytics("ns")
    rows: dict[str, dict[str, Any]] = {}
    for i, batch in enumerate(batches):
        for record in batch:
            a.arrival(record)
        if i == len(batches) - 1:
            a.progress(snap(T + 60_000, committed=committed))
        rows.update(windows(a.report(i)))
        a = roundtrip(a)  # saved and restored between batches, as the job does
    offsets = {(r.partition, r.offset) for batch in batches for r in batch}
    unreceived = {(p, o) for p, o in offsets if p != 0 or o >= committed}
    assert sum(r["arrivals"] for r in rows.values()) == len(offsets)
    assert a.backlog("Q") == len(unreceived)
    assert sum(r["receives"] for r in rows.values()) == len(offsets) - len(unreceived)


# --- MOVE CONVERSATION -------------------------------------------------------------------------


def test_a_move_marker_is_not_an_arrival():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(1, T + 2_000, mtype=MOVE_MARKER))
    a.progress(snap(T + 3_000))
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["backlog"]) == (1, 1)
    a.progress(snap(T + 4_000, committed=2))  # the marker's offset received too: one receive, not two
    row = windows(a.report(1))[f"queue/Q/{T}"]
    assert (row["receives"], row["backlog"]) == (1, 0)


def test_a_rekeyed_copy_replaces_its_original():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000, conv="c1", group="g1"))
    a.arrival(arr(1, T + 2_000, conv="c2", group="g1"))
    a.progress(snap(T + 3_500))
    before = windows(a.report(0))[f"queue/Q/{T}"]
    assert (before["arrivals"], before["backlog"]) == (2, 2)
    # MOVE CONVERSATION c1 to g2: a marker in g1's stream, then the copy of offset 0 under g2
    # (another partition), produced in the transaction that commits the original's offset.
    a.arrival(arr(2, T + 3_000, conv="c1", group="g1", mtype=MOVE_MARKER))
    a.arrival(arr(0, T + 4_000, partition=1, conv="c1", group="g2", rekeyed_from="0:0"))
    a.progress(snap(T + 10_000, committed=1))  # the move committed offset 0 (not a receive)
    after = windows(a.report(1))[f"queue/Q/{T}"]
    assert (after["arrivals"], after["receives"], after["backlog"]) == (2, 0, 2)
    assert after["oldest_unreceived_age_s"] == 9.0  # the copy is as old as its original
    assert after["top_groups"] == [
        {"group": "g2", "backlog": 1, "oldest_age_s": 9.0},
        {"group": "g1", "backlog": 1, "oldest_age_s": 8.0},
    ]
    a.progress(snap(T + 11_000, committed=1, partition=1))  # now the copy is received
    row = windows(a.report(2))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"]) == (2, 1, 1)


def test_a_rekeyed_copy_read_after_its_receive_counts_one_receive():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000))
    a.report(0)
    a.progress(snap(T + 5_000, committed=1, partition=1))  # the copy's receive, seen before the copy
    a.arrival(arr(0, T + 3_000, partition=1, group="g2", rekeyed_from="0:0"))
    row = windows(a.report(1))[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"]) == (1, 1, 0)


# --- top groups --------------------------------------------------------------------------------


def test_top_groups_are_the_largest_backlogs_ties_broken_by_age_then_name():
    a = Analytics("ns", top=3)
    layout = [  # (group, arrival times): gD is taken before gC, so order of arrival decides nothing
        ("gA", [T + 5_000, T + 6_000]),
        ("gD", [T + 1_000, T + 7_000, T + 8_000]),
        ("gC", [T + 1_000, T + 9_000, T + 9_500]),
        ("gB", [T + 3_000, T + 4_000, T + 4_500]),
        ("gE", [T]),
    ]
    offset = 0
    for group, times in layout:
        for ts in times:
            a.arrival(arr(offset, ts, conv=f"conv-{group}", group=group))
            offset += 1
    a.progress(snap(T + 10_000))
    row = windows(a.report(0))[f"queue/Q/{T}"]
    assert row["backlog"] == 12
    assert row["top_groups"] == [
        {"group": "gC", "backlog": 3, "oldest_age_s": 9.0},
        {"group": "gD", "backlog": 3, "oldest_age_s": 9.0},
        {"group": "gB", "backlog": 3, "oldest_age_s": 7.0},
    ]


# --- dialogs -----------------------------------------------------------------------------------


def only_change(out: Output, key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one dialog record and the one command the batch gave."""
    assert list(dialogs(out)) == [f"dialog/{key}"]
    assert [k for k, _ in out.commands] == [key]
    return dialogs(out)[f"dialog/{key}"], out.commands[0][1]


def test_a_dialog_goes_through_its_classes_with_one_record_and_one_command_per_change():
    a = Analytics("ns", stale_after_s=30.0)
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000))
    record, command = only_change(a.report(0), "c1/TARGET")
    assert (record["kind"], record["conversation_id"], record["side"], record["queue"], record["group"]) == (
        "dialog",
        "c1",
        "TARGET",
        "Q",
        "g1",
    )
    assert (record["class"], record["previous"], record["backlog"], record["oldest_age_s"]) == ("active", None, 1, 1.0)
    assert (record["errors"], record["timer_pending"], record["as_of"], record["batch"]) == (False, False, T + 2_000, 0)
    assert {k: v for k, v in command.items() if k != "reason"} == {
        "command": "RECLASSIFY",
        "conversation_id": "c1",
        "side": "TARGET",
        "queue": "Q",
        "from": None,
        "to": "active",
        "at": T + 2_000,
        "batch": 0,
    }

    a.progress(snap(T + 20_000))  # unchanged: nothing written
    out = a.report(1)
    assert dialogs(out) == {} and out.commands == []

    a.progress(snap(T + 31_000))  # the oldest unreceived message is 30 s old: Q's threshold
    record, command = only_change(a.report(2), "c1/TARGET")
    assert (record["class"], record["previous"], record["oldest_age_s"]) == ("stale", "active", 30.0)
    assert (command["from"], command["to"], command["at"], command["batch"]) == ("active", "stale", T + 31_000, 2)

    a.progress(snap(T + 40_000, committed=1))  # received: active again
    record, command = only_change(a.report(3), "c1/TARGET")
    assert (record["class"], record["previous"], record["backlog"], record["oldest_age_s"]) == (
        "active",
        "stale",
        0,
        None,
    )

    a.arrival(arr(1, T + 41_000, mtype=ERROR))
    a.progress(snap(T + 42_000, committed=2))
    record, command = only_change(a.report(4), "c1/TARGET")
    assert (record["class"], record["previous"], record["errors"]) == ("erroring", "active", True)
    assert (command["from"], command["to"]) == ("active", "erroring")

    a.timer("t1", ("Q", "c1", "TARGET"))
    a.progress(snap(T + 102_001))  # the error, the arrival and the receive are all over 60 s old
    record, command = only_change(a.report(5), "c1/TARGET")
    assert (record["class"], record["previous"], record["timer_pending"]) == ("timer_pending", "erroring", True)

    a.timer("t1", None)  # the tombstone disarms it
    a.progress(snap(T + 103_000))
    record, command = only_change(a.report(6), "c1/TARGET")
    assert (record["class"], record["previous"], record["timer_pending"]) == ("idle", "timer_pending", False)
    assert (command["from"], command["to"], command["batch"]) == ("timer_pending", "idle", 6)


def test_a_stale_dialogs_record_holds_its_oldest_unreceived_timestamp_and_follows_it():
    a = Analytics("ns", stale_after_s=5.0)
    for offset, ts in enumerate([T + 1_000, T + 2_000, T + 4_000]):
        a.arrival(arr(offset, ts))
    a.progress(snap(T + 6_000))
    record, _ = only_change(a.report(0), "c1/TARGET")
    assert (record["class"], record["oldest_unreceived"], record["oldest_age_s"]) == ("stale", T + 1_000, 5.0)
    a.progress(snap(T + 7_000))  # older, nothing else: nothing written (a view ages it from the timestamp)
    out = a.report(1)
    assert dialogs(out) == {} and out.commands == []
    a.progress(snap(T + 8_000, committed=1))  # the oldest received; the next one, 6 s old, is stale too
    out = a.report(2)
    record = dialogs(out)["dialog/c1/TARGET"]  # rewritten, with no command: the class is the same
    assert out.commands == []
    assert (record["class"], record["previous"], record["backlog"], record["oldest_unreceived"]) == (
        "stale",
        None,
        2,
        T + 2_000,
    )
    b = roundtrip(a, stale_after_s=5.0)  # what the record last said survives a restart: nothing written again
    b.progress(snap(T + 9_000, committed=1))
    assert dialogs(b.report(3)) == {}


def test_a_dialog_view_gives_the_age_now_from_the_stored_timestamp():
    row = {"class": "stale", "oldest_unreceived": T + 1_000, "oldest_age_s": 5.0, "as_of": T + 6_000}
    assert dialog_row_at(row, T + 204_000)["oldest_age_s"] == 203.0  # not the 5.0 of classification time
    assert row["oldest_age_s"] == 5.0  # the record itself is left as read
    earlier = {"class": "stale", "oldest_age_s": 9.4, "as_of": T + 10_000}  # written before the field was
    assert dialog_row_at(earlier, T + 203_600)["oldest_age_s"] == 203.0
    assert dialog_row_at({"oldest_unreceived": None, "oldest_age_s": None, "as_of": T}, T + 5)["oldest_age_s"] is None


def test_a_dead_lettered_message_makes_its_dialog_erroring():
    a = Analytics("ns")
    a.dead_lettered("Q", "c9", "INITIATOR", T + 1_000)
    a.progress(snap(T + 2_000))
    record, command = only_change(a.report(0), "c9/INITIATOR")
    assert (record["class"], record["side"], record["errors"], record["backlog"]) == ("erroring", "INITIATOR", True, 0)
    assert (command["to"], command["side"]) == ("erroring", "INITIATOR")
    a.progress(snap(T + 61_000))  # exactly one window later: still erroring
    assert a.report(1).commands == []
    a.progress(snap(T + 61_001))
    record, command = only_change(a.report(2), "c9/INITIATOR")
    assert (record["previous"], record["class"]) == ("erroring", "idle")


def test_a_stale_dialog_uses_its_queues_own_threshold():
    a = Analytics("ns", stale_after_s=30.0)
    a.stale_after["Q"] = 5.0
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(0, T + 1_000, queue="R", conv="c2"))
    a.progress(snap(T + 6_000))
    out = a.report(0)
    assert dialogs(out)["dialog/c1/TARGET"]["class"] == "stale"
    assert dialogs(out)["dialog/c2/TARGET"]["class"] == "active"
    assert sorted((k, c["to"]) for k, c in out.commands) == [("c1/TARGET", "stale"), ("c2/TARGET", "active")]


def test_an_idle_dialog_with_nothing_pending_is_forgotten_after_an_hour():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000, committed=1))  # last touched here
    a.report(0)
    a.progress(snap(T + 70_000))
    record, _ = only_change(a.report(1), "c1/TARGET")
    assert record["class"] == "idle"
    a.progress(snap(T + 2_000 + 3_600_000 - 1))
    out = a.report(2)
    assert dialogs(out) == {} and out.commands == []
    assert [d[0] for d in a.to_dict()["dialogs"]] == ["c1/TARGET"]
    a.progress(snap(T + 2_000 + 3_600_000))
    out = a.report(3)
    assert dialogs(out) == {} and out.commands == []
    assert a.to_dict()["dialogs"] == []


def test_a_dialog_with_something_pending_or_a_timer_is_never_forgotten():
    a = Analytics("ns", stale_after_s=100_000.0)
    a.arrival(arr(0, T + 1_000, conv="c1"))  # never received
    a.timer("t2", ("Q", "c2", "INITIATOR"))
    a.progress(snap(T + 2_000))
    a.report(0)
    a.progress(snap(T + 3 * 3_600_000))
    out = a.report(1)
    assert sorted(d[0] for d in a.to_dict()["dialogs"]) == ["c1/TARGET", "c2/INITIATOR"]
    assert dialogs(out)["dialog/c1/TARGET"]["class"] == "idle"  # no class for "waiting long"; not stale here
    assert dialogs(out).get("dialog/c2/INITIATOR") is None  # timer_pending from the start, unchanged


def test_a_dialog_is_reported_idle_before_it_is_forgotten():
    # A job catching up after hours away can jump its clock past the hour in one batch: the worker
    # must still be told the dialog went idle, or it lists it as active forever.
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000, committed=1))
    assert only_change(a.report(0), "c1/TARGET")[0]["class"] == "active"
    a.progress(snap(T + 2 * 3_600_000))
    record, command = only_change(a.report(1), "c1/TARGET")
    assert (record["previous"], record["class"], command["to"]) == ("active", "idle", "idle")
    a.progress(snap(T + 2 * 3_600_000 + 1_000))
    out = a.report(2)
    assert dialogs(out) == {} and out.commands == []
    assert a.to_dict()["dialogs"] == []


# --- windows closing ---------------------------------------------------------------------------


def test_a_window_closes_once_one_window_after_its_end_and_reopens_for_a_late_record():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.progress(snap(T + 2_000))
    assert a.report(0).closed == []
    a.progress(snap(T + 119_999))
    assert a.report(1).closed == []
    a.progress(snap(T + 120_000))  # window T ended at T + 60 s; one window later it closes
    closed = a.report(2).closed
    assert [(c["queue"], c["window_start"], c["arrivals"], c["batch"]) for c in closed] == [("Q", T, 1, 2)]
    assert closed[0]["backlog"] == 1 and closed[0]["as_of"] == T + 120_000
    a.progress(snap(T + 130_000))
    assert a.report(3).closed == []  # once
    a.arrival(arr(1, T + 5_000))  # late: touches window T again
    a.progress(snap(T + 131_000))
    out = a.report(4)
    assert out.closed == []  # not in the batch that touched it
    assert windows(out)[f"queue/Q/{T}"]["arrivals"] == 2
    a.progress(snap(T + 132_000))
    assert [(c["window_start"], c["arrivals"]) for c in a.report(5).closed] == [(T, 2)]
    a.progress(snap(T + 180_000))  # and window T + 60 s in its turn
    assert [c["window_start"] for c in a.report(6).closed] == [T + 60_000]


def test_a_window_touched_in_the_batch_that_would_close_it_stays_open():
    a = Analytics("ns")
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(1, T + 125_000))  # one batch from T + 1 s to T + 125 s: window T was touched
    out = a.report(0)
    assert out.closed == []
    assert windows(out)[f"queue/Q/{T}"]["arrivals"] == 1
    a.progress(snap(T + 126_000))
    assert [c["window_start"] for c in a.report(1).closed] == [T]


# --- state -------------------------------------------------------------------------------------


def test_the_saved_state_restores_the_same_numbers():
    a = Analytics("ns", top=2)
    a.stale_after["Q"] = 12.0
    a.arrival(arr(0, T + 1_000))
    a.arrival(arr(1, T + 2_000, conv="c2", group="g2"))
    a.progress(snap(T + 3_000, committed=-1, completed=(1,)))
    a.timer("t", ("Q", "c1", "TARGET"))
    a.report(0)
    b = roundtrip(a, top=2)
    b.stale_after["Q"] = 12.0
    for x in (a, b):
        x.arrival(arr(2, T + 20_000))
        x.progress(snap(T + 21_000, committed=1))
    out_a, out_b = a.report(1), b.report(1)
    assert out_a == out_b
    row = windows(out_b)[f"queue/Q/{T}"]
    assert (row["arrivals"], row["receives"], row["backlog"], row["stale"]["queue"]) == (3, 2, 1, 0)


# --- the replay property -----------------------------------------------------------------------

QUEUES = ("Q", "R")
SETTINGS: dict[str, Any] = {"window_s": 10.0, "stale_after_s": 15.0, "top": 2}


@st.composite
def histories(draw: st.DrawFn) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """A run of the job: events (what Spark read, in order) split into batches."""
    clock = T
    tops: dict[tuple[str, int], int] = {}  # the next offset per (queue, partition)
    events: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(draw(st.integers(1, 40))):
        clock += draw(st.integers(0, 12_000))
        kind = draw(st.sampled_from(["arrival"] * 4 + ["snapshot"] * 3 + ["again", "move", "timer", "dead"]))
        queue, partition = draw(st.sampled_from(QUEUES)), draw(st.integers(0, 1))
        nxt = tops.get((queue, partition), 0)
        conv, side = draw(st.sampled_from(["c0", "c1", "c2"])), draw(st.sampled_from(["INITIATOR", "TARGET"]))
        if kind == "arrival":
            mtype = draw(st.sampled_from([MSG, MSG, MSG, ERROR, MOVE_MARKER]))
            ts = clock - draw(st.integers(0, 3_000))  # records may be older than the clock
            events.append(("arrival", (queue, partition, nxt, ts, conv, side, f"g{conv}", mtype, None)))
            tops[(queue, partition)] = nxt + 1
        elif kind == "again" and nxt:
            ts = clock - draw(st.integers(0, 3_000))
            events.append(
                ("arrival", (queue, partition, draw(st.integers(0, nxt - 1)), ts, conv, side, "g", MSG, None))
            )
        elif kind == "move" and nxt:
            origin = f"{partition}:{draw(st.integers(0, nxt - 1))}"
            other = 1 - partition
            at = tops.get((queue, other), 0)
            events.append(("arrival", (queue, other, at, clock, conv, side, "gmoved", MSG, origin)))
            tops[(queue, other)] = at + 1
        elif kind == "snapshot":
            committed = draw(st.integers(-1, nxt + 2))  # may run ahead of what was read
            completed = draw(st.frozensets(st.integers(max(committed, 0), nxt + 3), max_size=4))
            events.append(("progress", (queue, clock, ((partition, committed, completed),))))
        elif kind == "timer":
            armed = draw(st.booleans())
            events.append(("timer", (f"t-{conv}", (queue, conv, side) if armed else None)))
        elif kind == "dead":
            events.append(("dead", (queue, conv, side, clock)))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(events)), max_size=6))))
    bounds = [0, *cuts, len(events)]
    return [events[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


def apply_batch(a: Analytics, batch: list[tuple[str, tuple[Any, ...]]], batch_id: int) -> Output:
    a.stale_after = {"Q": 5.0}  # the job sets the catalog's thresholds before each batch
    for kind, args in batch:
        if kind == "arrival":
            q, p, o, ts, conv, side, group, mtype, origin = args
            a.arrival(Arrival(q, p, o, ts, f"m-{q}-{p}-{o}", conv, side, group, mtype, origin))
        elif kind == "progress":
            a.progress(Progress(*args))
        elif kind == "timer":
            a.timer(*args)
        else:
            a.dead_lettered(*args)
    return a.report(batch_id)


def saved(a: Analytics) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(a.to_dict()))


def restored(state: dict[str, Any] | None) -> Analytics:
    return Analytics("ns", **SETTINGS) if state is None else Analytics.from_dict(state, "ns", **SETTINGS)


@settings(max_examples=150, deadline=None)
@given(histories(), st.data())
def test_a_restarted_job_counts_nothing_twice(batches, data):
    # One uninterrupted run, saving the state after every batch as the job does.
    a = restored(None)
    outputs, states = [], []
    for i, batch in enumerate(batches):
        outputs.append(apply_batch(a, batch, i))
        states.append(saved(a))
    final = saved(a)

    # Killed after batch k: restored from k's state, batches k+1.. give the same everything.
    k = data.draw(st.integers(0, len(batches) - 1), label="k")
    b = restored(states[k])
    again = [apply_batch(b, batch, i) for i, batch in enumerate(batches) if i > k]
    assert again == outputs[k + 1 :]
    assert saved(b) == final

    # Killed during batch k: it runs again from k-1's state, twice, with the same result each time.
    before = states[k - 1] if k else None
    for _ in range(2):
        c = restored(before)
        assert apply_batch(c, batches[k], k) == outputs[k]
        assert saved(c) == states[k]


def test_the_replay_example_is_not_vacuous():
    # A fixed history through the same harness: the numbers it must give, so the property above
    # compares something.
    batches = [
        [
            ("arrival", ("Q", 0, 0, T + 1_000, "c0", "TARGET", "g0", MSG, None)),
            ("arrival", ("Q", 0, 1, T + 2_000, "c0", "TARGET", "g0", MSG, None)),
            ("progress", ("Q", T + 3_000, ((0, 1, frozenset()),))),
        ],
        [
            ("arrival", ("Q", 0, 1, T + 2_000, "c0", "TARGET", "g0", MSG, None)),  # replayed record
            ("progress", ("Q", T + 9_000, ((0, 2, frozenset()),))),
        ],
    ]
    a = restored(None)
    first = apply_batch(a, batches[0], 0)
    state0 = saved(a)
    second = apply_batch(a, batches[1], 1)
    assert (windows(first)[f"queue/Q/{T}"]["arrivals"], windows(first)[f"queue/Q/{T}"]["receives"]) == (2, 1)
    assert (windows(second)[f"queue/Q/{T}"]["arrivals"], windows(second)[f"queue/Q/{T}"]["receives"]) == (2, 2)
    b = restored(state0)
    assert apply_batch(b, batches[1], 1) == second
