"""The transmitter's transmission queue (core/routing/transmission.py): Service Broker's retransmission
schedule, the acks topic's keys, and what TransmissionQueue holds, sends and lets the consumer
group commit. The stateful test at the end replays random reads, sends, acknowledgements,
refusals and rebalances against a reference model of the transmission topic, and checks the
guarantee the module exists for: a committed offset never passes a message the far side has not
acknowledged, so a transmitter that dies loses nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kbroker.core.routing.transmission import (
    RETRY_DELAYS,
    RETRY_EVERY,
    Outgoing,
    Refusal,
    TransmissionQueue,
    ack_key,
    parse_ack_key,
    retry_delay,
)

NS = "ns1"
REQ = "//app/Request"
END = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
ERR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
REFUSED = (-8425, "The service contract '//app/C' is not found.")


def out(
    partition: int,
    offset: int,
    seq: int = 0,
    *,
    conv: str = "c1",
    side: str = "TARGET",
    size: int = 10,
    mtype: str = REQ,
) -> Outgoing:
    """One record of the transmission topic as the transmitter reads it."""
    return Outgoing(
        partition,
        offset,
        conv,
        side,
        seq,
        "//svc/Target",
        "far",
        "//svc/Init",
        mtype,
        "//app/C",
        f"h-{conv}-{side}",
        1_000.0,
        size,
    )


def key(conv: str = "c1", side: str = "TARGET") -> str:
    return ack_key(NS, conv, side)


def positions(ms) -> list[tuple[int, int]]:
    return [(m.partition, m.offset) for m in ms]


# --- the retransmission schedule -----------------------------------------------------------


def test_retry_delay_is_service_brokers_schedule():
    # Reference item 54: again after 4, 8, 16 and 32 s, then every 64 s for good.
    assert [retry_delay(n) for n in range(1, 9)] == [4.0, 8.0, 16.0, 32.0, 64.0, 64.0, 64.0, 64.0]
    assert RETRY_DELAYS == (4.0, 8.0, 16.0, 32.0) and RETRY_EVERY == 64.0


def test_retry_delay_before_any_send_is_zero():
    assert retry_delay(0) == 0.0 and retry_delay(-3) == 0.0


@given(st.integers(-5, 10_000))
def test_retry_delay_never_shrinks_and_never_exceeds_64_s(n):
    assert 0.0 <= retry_delay(n) <= retry_delay(n + 1) <= RETRY_EVERY


# --- acks topic keys -----------------------------------------------------------------------


def test_ack_key_layout():
    assert ack_key("ns", "conv", "TARGET") == "ns|conv|TARGET"
    assert parse_ack_key("ns|conv|TARGET") == ("ns", "conv", "TARGET")


@pytest.mark.parametrize("bad", ["", "a|b", "a|b|c|d", "|b|c", "a||c", "a|b|", "||"])
def test_parse_ack_key_refuses_anything_but_three_non_empty_parts(bad):
    assert parse_ack_key(bad) is None


part = st.text(st.characters(blacklist_characters="|", blacklist_categories=("Cs",)), min_size=1, max_size=12)


@given(part, part, part)
def test_ack_key_round_trips(namespace, conversation, side):
    assert parse_ack_key(ack_key(namespace, conversation, side)) == (namespace, conversation, side)


# --- reading ---------------------------------------------------------------------------------


def test_an_added_message_is_held_counted_and_due_at_once():
    q = TransmissionQueue(NS)
    m = out(0, 7, size=25)
    assert q.add(m) is None
    assert len(q) == 1 and q.bytes == 25 and q.directions() == {key()}
    assert q.due(0.0) == [m]  # next_try 0: never tried, send now
    assert q.commit_offsets() == {0: 7}  # the unacknowledged message is where a successor resumes


def test_key_of_uses_the_queues_own_namespace():
    assert TransmissionQueue("nsX").key_of(out(0, 0, conv="c9", side="INITIATOR")) == "nsX|c9|INITIATOR"


def test_due_is_in_partition_then_offset_order_whatever_the_read_order():
    q = TransmissionQueue(NS)
    for p, o, conv in [(2, 5, "a"), (0, 9, "b"), (1, 3, "c"), (0, 4, "d"), (2, 1, "e")]:
        q.add(out(p, o, conv=conv))
    assert positions(q.due(0.0)) == [(0, 4), (0, 9), (1, 3), (2, 1), (2, 5)]
    assert [(r["partition"], r["offset"]) for r in q.rows()] == [(0, 4), (0, 9), (1, 3), (2, 1), (2, 5)]


def test_commit_offsets_of_a_partition_with_nothing_waiting_is_all_that_was_read():
    q = TransmissionQueue(NS)
    q.add(out(0, 0, 0))
    q.add(out(0, 1, 1))
    q.add(out(3, 4, 0, conv="c2"))
    q.acknowledge(key(), 2)
    assert q.commit_offsets() == {0: 2, 3: 4}  # partitions never read are not committed


def test_commit_offsets_stops_at_the_oldest_unacknowledged_of_any_direction():
    q = TransmissionQueue(NS)
    q.add(out(0, 10, 0, conv="a"))
    q.add(out(0, 11, 0, conv="b"))
    q.add(out(0, 12, 1, conv="a"))
    q.acknowledge(key("a"), 2)  # a is done, b's message at offset 11 is not
    assert q.commit_offsets() == {0: 11}
    q.acknowledge(key("b"), 1)
    assert q.commit_offsets() == {0: 13}


# --- sending ---------------------------------------------------------------------------------


def test_sent_follows_the_retransmission_schedule_and_due_respects_next_try():
    q = TransmissionQueue(NS)
    m = out(0, 0)
    q.add(m)
    now = 100.0
    for delay in (4.0, 8.0, 16.0, 32.0, 64.0, 64.0):
        assert q.due(now) == [m]
        q.sent(m, now, "kafka:9092/far")
        assert m.next_try == now + delay
        assert q.due(now + delay - 0.001) == []
        now += delay
    assert m.attempts == 6 and m.destination == "kafka:9092/far"


def test_sent_clears_a_waiting_status_and_waiting_sets_one():
    q = TransmissionQueue(NS)
    m = out(0, 0)
    q.add(m)
    q.waiting(m, 50.0, "The route to target service '//svc/Target' was not found.", 5.0)
    assert (m.status, m.next_try, m.attempts) == ("The route to target service '//svc/Target' was not found.", 55.0, 0)
    assert q.due(54.9) == [] and q.due(55.0) == [m]
    assert q.rows()[0]["transmission_status"].startswith("The route")
    q.sent(m, 55.0, "d")
    assert (m.status, m.attempts, m.next_try) == ("", 1, 59.0)


def test_note_status_marks_only_that_directions_messages():
    q = TransmissionQueue(NS)
    a, b = out(0, 0, conv="a"), out(0, 1, conv="b")
    q.add(a)
    q.add(b)
    q.note_status(key("a"), "The target service name could not be found.")
    assert a.status == "The target service name could not be found." and b.status == ""
    q.note_status(key("nobody"), "x")  # no message of that direction: nothing happens


def test_rows_are_sys_transmission_queue_rows():
    q = TransmissionQueue(NS)
    q.add(out(1, 5, 3, conv="cv", size=12))
    q.add(out(1, 6, 4, conv="cv", mtype=END))
    q.add(out(0, 2, 0, conv="e", mtype=ERR))
    rows = q.rows()
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 2), (1, 5), (1, 6)]
    first = rows[1]
    assert first == {
        "conversation_handle": "h-cv-TARGET",
        "conversation_id": "cv",
        "to_service_name": "//svc/Target",
        "to_broker_instance": "far",
        "from_service_name": "//svc/Init",
        "service_contract_name": "//app/C",
        "enqueue_time": 1_000.0,
        "message_sequence_number": 3,
        "message_type_name": REQ,
        "is_end_of_dialog": False,
        "is_conversation_error": False,
        "priority": 5,
        "security": "",
        "transmission_status": "",
        "destination": None,
        "attempts": 0,
        "partition": 1,
        "offset": 5,
    }
    assert rows[2]["is_end_of_dialog"] and not rows[2]["is_conversation_error"]
    assert rows[0]["is_conversation_error"] and not rows[0]["is_end_of_dialog"]
    assert [(r["partition"], r["offset"]) for r in q.rows(limit=2)] == [(0, 2), (1, 5)]


# --- acknowledgements ------------------------------------------------------------------------


def test_backlog_counts_and_ages_the_held_messages_per_destination():
    q = TransmissionQueue(NS)
    for m in (out(0, 0, 0), out(0, 1, 1), out(1, 0, 0, conv="c2")):
        q.add(m)
    q.sent(q.held()[0], 1_010.0, "host:1/far")
    q.waiting(q.held()[2], 1_010.0, "Connection to host:2/other broke", 4.0, destination="host:2/other")
    assert q.backlog(1_030.0) == {"host:1/far": (1, 30.0), "": (1, 30.0), "host:2/other": (1, 30.0)}
    q.acknowledge(key(), 1)
    assert q.backlog(1_030.0) == {"": (1, 30.0), "host:2/other": (1, 30.0)}
    assert TransmissionQueue(NS).backlog(0.0) == {}


def test_acknowledge_drops_the_direction_below_next_only():
    q = TransmissionQueue(NS)
    for seq in range(4):
        q.add(out(0, seq, seq, size=10))
    q.add(out(0, 4, 0, side="INITIATOR", size=7))  # the other direction of the same dialog
    assert q.acknowledge(key(), 2) is None
    assert [m.sequence for m in q.due(0.0) if m.to_side == "TARGET"] == [2, 3]
    assert len(q) == 3 and q.bytes == 27
    assert q.commit_offsets() == {0: 2}


def test_an_older_acknowledgement_arriving_late_changes_nothing():
    q = TransmissionQueue(NS)
    q.acknowledge(key(), 5)
    q.acknowledge(key(), 3)  # out of date: the far side already expected 5
    q.add(out(0, 0, 4))
    assert len(q) == 0  # 4 < 5: still acknowledged


def test_a_message_read_again_after_its_acknowledgement_is_not_held_but_read_past():
    # A rebalance hands the partition back from the committed offset: what the far side already
    # acknowledged is read again, is not sent again, and does not hold the commit back.
    q = TransmissionQueue(NS)
    q.add(out(0, 0, 0))
    q.add(out(0, 1, 1))
    q.acknowledge(key(), 2)
    q.drop_partitions([0])
    assert q.add(out(0, 0, 0)) is None and q.add(out(0, 1, 1)) is None
    assert len(q) == 0 and q.bytes == 0 and q.due(1e9) == []
    assert q.commit_offsets() == {0: 2}


def test_an_acknowledgement_ahead_of_the_read_covers_messages_not_read_yet():
    # Another transmitter sent them before a rebalance; the far side's ack arrives here first.
    q = TransmissionQueue(NS)
    q.acknowledge(key(), 3)
    for seq in range(5):
        q.add(out(0, seq, seq))
    assert [m.sequence for m in q.due(0.0)] == [3, 4]
    assert q.commit_offsets() == {0: 3}


def test_a_refusal_drops_every_held_message_of_the_direction_in_sequence_order():
    q = TransmissionQueue(NS)
    q.add(out(0, 0, 0, size=5))
    q.add(out(0, 1, 1, size=6))
    q.add(out(0, 2, 0, conv="other", size=7))
    refusal = q.acknowledge(key(), 1, REFUSED)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.description) == REFUSED
    assert [(m.sequence, m.offset) for m in refusal.dropped] == [(0, 0), (1, 1)]
    assert q.directions() == {key("other")} and q.bytes == 7 and len(q) == 1
    assert q.commit_offsets() == {0: 2}  # refused messages hold nothing back


def test_after_a_refusal_later_messages_of_that_direction_are_refused_at_once():
    q = TransmissionQueue(NS)
    q.acknowledge(key(), 0, REFUSED)
    late = out(0, 3, 5)
    refusal = q.add(late)
    assert refusal == Refusal((late,), *REFUSED)
    assert refusal.dropped[0] is late
    assert len(q) == 0 and q.bytes == 0
    assert q.commit_offsets() == {0: 4}  # read past: nothing of that direction waits
    assert q.add(out(0, 4, 0, side="INITIATOR")) is None and len(q) == 1  # the other direction goes on


def test_a_refusal_with_nothing_held_still_reports_its_error():
    assert TransmissionQueue(NS).acknowledge(key(), 0, REFUSED) == Refusal((), *REFUSED)


def test_a_refusal_is_not_undone_by_forget():
    q = TransmissionQueue(NS)
    q.acknowledge(key(), 1, REFUSED)
    q.forget([key()])
    assert isinstance(q.add(out(0, 0, 7)), Refusal) and len(q) == 0


# --- forgetting and rebalances --------------------------------------------------------------


def test_forget_keeps_acknowledgements_a_message_still_waits_for():
    q = TransmissionQueue(NS)
    q.add(out(0, 0, 0))
    q.add(out(0, 1, 1))
    q.acknowledge(key(), 1)
    q.acknowledge(key("idle"), 9)
    q.forget([key(), key("idle")])
    # Still waiting on key(): its acknowledgement stays, so seq 0 read again is not held.
    q.drop_partitions([0])
    q.add(out(0, 0, 0))
    q.add(out(0, 1, 1))
    assert [m.sequence for m in q.due(0.0)] == [1]
    # key("idle") was forgotten: bounded memory; a re-read costs one resend (the far side drops it).
    q.add(out(1, 0, 8, conv="idle"))
    assert len(q) == 2


def test_drop_partitions_gives_up_their_messages_and_read_positions():
    q = TransmissionQueue(NS)
    q.add(out(0, 0, 0, conv="a", size=3))
    q.add(out(1, 0, 0, conv="b", size=4))
    q.add(out(1, 1, 1, conv="b", size=5))
    q.drop_partitions([1, 7])  # 7 was never read: ignored
    assert positions(q.due(0.0)) == [(0, 0)]
    assert q.bytes == 3 and len(q) == 1 and q.directions() == {key("a")}
    assert q.commit_offsets() == {0: 0}
    # The acknowledgements survive: the partition may come back.
    q.acknowledge(key("b"), 1)
    q.add(out(1, 0, 0, conv="b", size=4))
    q.add(out(1, 1, 1, conv="b", size=5))
    assert positions(q.due(0.0)) == [(0, 0), (1, 1)] and q.bytes == 8


def test_reading_a_held_record_again_counts_its_bytes_once():
    # The same record (same partition and offset) read twice while still held, e.g. a consumer
    # that re-delivers without a revoke. `bytes` drives the transmitter's pause (MAX_WAITING_BYTES),
    # so it must stay the sum of what is held.
    q = TransmissionQueue(NS)
    q.add(out(0, 5, 0, size=10))
    q.add(out(0, 5, 0, size=10))
    assert len(q) == 1
    assert q.bytes == 10
    q.acknowledge(key(), 1)
    assert len(q) == 0
    assert q.bytes == 0


# --- the model-based test ---------------------------------------------------------------------

DIRECTIONS = [("c0", "TARGET"), ("c0", "INITIATOR"), ("c1", "TARGET"), ("c2", "INITIATOR"), ("c3", "TARGET")]
PARTITIONS = (0, 1)


def partition_of(d: int) -> int:
    # One dialog side's messages share a partition (the record key is its conversation handle);
    # several directions share one, so commits interleave them.
    return d % len(PARTITIONS)


class TransmissionMachine(RuleBasedStateMachine):
    """The transmission topic as lists of (direction, sequence, size) per partition, a consumer
    reading it from a position, the far side's acknowledgements, and the consumer group's
    commits. The model holds what the queue should hold; `done` is the truth of the far side."""

    def __init__(self) -> None:
        super().__init__()
        self.q = TransmissionQueue(NS)
        self.topic: dict[int, list[tuple[int, int, int]]] = {p: [] for p in PARTITIONS}
        self.read_pos = {p: 0 for p in PARTITIONS}
        self.committed = {p: 0 for p in PARTITIONS}
        self.next_seq = [0] * len(DIRECTIONS)
        self.far_next = [0] * len(DIRECTIONS)  # the highest next sequence the far side ever sent
        self.remembered: dict[int, int] = {}  # what the queue still knows of far_next (forget)
        self.refused: set[int] = set()
        self.held: dict[tuple[int, int], tuple[int, int, int]] = {}  # (p, offset) -> (d, seq, size)
        self.now = 0.0

    def key(self, d: int) -> str:
        return ack_key(NS, *DIRECTIONS[d])

    def done(self, d: int, seq: int) -> bool:
        """The far side has it (or refused the dialog): nobody need ever send it again."""
        return d in self.refused or seq < self.far_next[d]

    # rules ----------------------------------------------------------------------------------

    @rule(d=st.integers(0, len(DIRECTIONS) - 1), size=st.integers(0, 100))
    def produce(self, d, size):
        self.topic[partition_of(d)].append((d, self.next_seq[d], size))
        self.next_seq[d] += 1

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(1, 4))
    def read(self, p, n):
        for _ in range(n):
            offset = self.read_pos[p]
            if offset >= len(self.topic[p]):
                return
            d, seq, size = self.topic[p][offset]
            conv, side = DIRECTIONS[d]
            m = out(p, offset, seq, conv=conv, side=side, size=size)
            result = self.q.add(m)
            if d in self.refused:
                assert result == Refusal((m,), *REFUSED)
            else:
                assert result is None
                if seq >= self.remembered.get(d, 0):
                    self.held[(p, offset)] = (d, seq, size)
            self.read_pos[p] += 1

    @rule(d=st.integers(0, len(DIRECTIONS) - 1), data=st.data())
    def acknowledge(self, d, data):
        # The far side can only expect what was produced; a late, older ack is possible too.
        nxt = data.draw(st.integers(0, self.next_seq[d]))
        assert self.q.acknowledge(self.key(d), nxt) is None
        self.far_next[d] = max(self.far_next[d], nxt)
        self.remembered[d] = max(self.remembered.get(d, 0), nxt)
        self.held = {pos: v for pos, v in self.held.items() if not (v[0] == d and v[1] < nxt)}

    @rule(d=st.integers(0, len(DIRECTIONS) - 1), data=st.data())
    def refuse(self, d, data):
        nxt = data.draw(st.integers(0, self.next_seq[d]))
        mine = sorted((v[1], pos) for pos, v in self.held.items() if v[0] == d)
        refusal = self.q.acknowledge(self.key(d), nxt, REFUSED)
        assert refusal is not None and (refusal.code, refusal.description) == REFUSED
        assert [(m.sequence, (m.partition, m.offset)) for m in refusal.dropped] == mine
        self.refused.add(d)
        self.far_next[d] = max(self.far_next[d], nxt)
        self.remembered[d] = max(self.remembered.get(d, 0), nxt)
        self.held = {pos: v for pos, v in self.held.items() if v[0] != d}

    @rule(dt=st.sampled_from([0.0, 1.0, 4.0, 10.0, 64.0]))
    def send_due(self, dt):
        self.now += dt
        due = self.q.due(self.now)
        everything = self.q.due(float("inf"))
        assert due == [m for m in everything if m.next_try <= self.now]
        for m in due:
            before = m.attempts
            self.q.sent(m, self.now, "far")
            assert m.attempts == before + 1 and m.next_try == self.now + retry_delay(m.attempts)

    @rule(retry_in=st.sampled_from([1.0, 5.0]))
    def wait_first_due(self, retry_in):
        due = self.q.due(self.now)
        if due:
            self.q.waiting(due[0], self.now, "no route", retry_in)
            assert due[0] not in self.q.due(self.now) and due[0].status == "no route"

    @rule()
    def commit(self):
        for p, offset in self.q.commit_offsets().items():
            self.committed[p] = offset

    @rule(p=st.sampled_from(PARTITIONS), commit_first=st.booleans())
    def rebalance(self, p, commit_first):
        """The partition is revoked (after a last commit, as _on_revoke does) or lost (the
        transmitter died: no commit), and read again from the committed offset."""
        if commit_first:
            self.committed[p] = self.q.commit_offsets().get(p, self.committed[p])
        self.q.drop_partitions([p])
        self.held = {pos: v for pos, v in self.held.items() if pos[0] != p}
        self.read_pos[p] = self.committed[p]

    @rule()
    def forget(self):
        self.q.forget([self.key(d) for d in range(len(DIRECTIONS))])
        waiting = {v[0] for v in self.held.values()}
        self.remembered = {d: n for d, n in self.remembered.items() if d in waiting}

    # invariants -------------------------------------------------------------------------------

    @invariant()
    def holds_what_the_model_holds(self):
        everything = self.q.due(float("inf"))
        assert positions(everything) == sorted(self.held)
        assert [(m.sequence, m.size) for m in everything] == [self.held[pos][1:] for pos in sorted(self.held)]
        assert len(self.q) == len(self.held)
        assert [(r["partition"], r["offset"]) for r in self.q.rows(limit=10_000)] == sorted(self.held)
        assert self.q.directions() == {self.key(v[0]) for v in self.held.values()}

    @invariant()
    def bytes_is_the_sum_of_held_sizes(self):
        assert self.q.bytes == sum(v[2] for v in self.held.values())

    @invariant()
    def nothing_acknowledged_or_refused_is_held(self):
        for m in self.q.due(float("inf")):
            d = DIRECTIONS.index((m.conversation_id, m.to_side))
            assert d not in self.refused
            assert m.sequence >= self.remembered.get(d, 0)

    @invariant()
    def commits_never_pass_an_unacknowledged_message(self):
        # The guarantee: every record below a commit is done, so a successor reading from the
        # committed offset resends everything the far side may still need.
        for p, c in self.q.commit_offsets().items():
            assert self.committed[p] <= c <= self.read_pos[p]
            for d, seq, _ in self.topic[p][:c]:
                assert self.done(d, seq), (p, d, seq, c)
        for p, c in self.committed.items():
            assert all(self.done(d, seq) for d, seq, _ in self.topic[p][:c])


TestTransmissionQueueModel = TransmissionMachine.TestCase
TestTransmissionQueueModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# --- properties on plain sequences ---------------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=30, unique=True), st.integers(0, 12))
def test_after_acknowledging_n_nothing_below_n_is_due_or_held(seqs, n):
    q = TransmissionQueue(NS)
    for offset, seq in enumerate(seqs):
        q.add(out(0, offset, seq, size=seq))
    q.acknowledge(key(), n)
    assert sorted(m.sequence for m in q.due(float("inf"))) == sorted(s for s in seqs if s >= n)
    q.drop_partitions([0])
    for offset, seq in enumerate(seqs):  # read again after a rebalance: still not held
        q.add(out(0, offset, seq, size=seq))
    left = q.due(float("inf"))
    assert sorted(m.sequence for m in left) == sorted(s for s in seqs if s >= n)
    assert q.bytes == sum(m.size for m in left)
    assert q.commit_offsets()[0] == min([o for o, s in enumerate(seqs) if s >= n], default=len(seqs))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 200), st.integers(0, 5)), max_size=25), st.floats(0, 200))
def test_due_is_sorted_and_respects_next_try(specs, now):
    q = TransmissionQueue(NS)
    for i, (p, next_try, seq) in enumerate(specs):
        m = out(p, 100 - i, seq, conv=f"c{i}")  # read in falling offset order
        q.add(m)
        m.next_try = next_try
    due = q.due(now)
    assert positions(due) == sorted(positions(due))
    assert sorted(positions(due)) == sorted((p, 100 - i) for i, (p, t, _) in enumerate(specs) if t <= now)


# --- what a message follows, and a dialog that makes no progress --------------------------------


def test_follows_is_the_highest_held_predecessor_or_minus_one_when_all_were_acknowledged():
    q = TransmissionQueue(NS)
    ms = [out(0, 0, 0), out(0, 1, 1), out(0, 2, 2), out(0, 3, 1024), out(0, 4, 1025)]
    for m in ms:
        q.add(m)
    other = out(0, 5, 7, conv="other")
    q.add(other)
    assert [q.follows(m) for m in ms] == [-1, 0, 1, 2, 1024]
    assert q.follows(other) == -1  # another direction's messages are not its predecessors
    q.acknowledge(key(), 3)  # the dead holder's 0..2 were saved
    assert q.follows(ms[3]) == -1 and q.follows(ms[4]) == 1024


def test_a_direction_unacknowledged_for_a_minute_is_reported_once_with_a_status():
    q = TransmissionQueue(NS)
    a0, a1, b0 = out(0, 0, 0), out(0, 1, 1), out(0, 2, 0, conv="b")
    for m in (a0, a1, b0):
        q.add(m)
    q.sent(a0, 100.0, "kafka:9092/far")
    q.sent(a1, 100.0, "kafka:9092/far")
    assert q.stalled(159.9) == []  # b0 was never sent (no route, say): its own status says why
    assert q.stalled(160.0) == [a0]  # the direction's first message only
    assert a0.status.startswith("No acknowledgement from kafka:9092/far after 1 send(s)")
    q.sent(a0, 164.0, "kafka:9092/far")
    assert a0.status.startswith("No acknowledgement")  # a resend keeps it
    assert q.stalled(500.0) == []  # once
    q.acknowledge(key(), 1)
    assert q.stalled(500.0) == [a1]  # the next one holds the dialog up now


def test_a_status_from_the_far_side_lasts_through_resends_and_is_not_replaced_by_a_stall():
    q = TransmissionQueue(NS)
    m = out(0, 0, 5)
    q.add(m)
    q.sent(m, 0.0, "d")
    q.note_status(key(), "The far side expects message 3 of this dialog next; message 5 waits for it.")
    q.sent(m, 4.0, "d")
    assert m.status.startswith("The far side expects message 3")
    assert q.stalled(61.0) == [m] and m.status.startswith("The far side expects message 3")
