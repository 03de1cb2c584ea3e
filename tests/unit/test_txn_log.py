"""Kafka's transaction log read for one transactional id (core/txn/transaction_log.py): the record formats
(versions 0 and 1 of the value), the partition an id lives in, how the last transaction before
an init ended, and when the committer asks. Records are built here byte by byte, as Kafka's
generated serialisers write them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.txn.transaction_log import (
    OFFSETS_TOPIC,
    OpenTransactionCheck,
    Outcome,
    TxnLogEntry,
    TxnLogFormatError,
    TxnState,
    outcome_before_init,
    parse_key,
    parse_value,
    partition_of,
)


def uvarint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def key(txn_id: str) -> bytes:
    raw = txn_id.encode()
    return struct.pack(">hh", 0, len(raw)) + raw


def value(
    version: int, pid: int, epoch: int, state: TxnState, parts: dict[str, list[int]] | None, tagged: bytes = b""
) -> bytes:
    out = struct.pack(">hqhib", version, pid, epoch, 10_000, int(state))
    if version == 0:
        out += struct.pack(">i", -1 if parts is None else len(parts))
        for topic, ids in (parts or {}).items():
            out += struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", len(ids))
            out += b"".join(struct.pack(">i", i) for i in ids)
        return out + struct.pack(">qq", 1_700_000_000_000, 1_700_000_000_000)
    out += uvarint(0 if parts is None else len(parts) + 1)
    for topic, ids in (parts or {}).items():
        out += uvarint(len(topic) + 1) + topic.encode() + uvarint(len(ids) + 1)
        out += b"".join(struct.pack(">i", i) for i in ids) + uvarint(0)
    return out + struct.pack(">qq", 1_700_000_000_000, 1_700_000_000_000) + (tagged or uvarint(0))


def test_keys_name_their_transactional_id_and_other_kinds_are_not_ours():
    assert parse_key(key("kbroker.ns.txn-1")) == "kbroker.ns.txn-1"
    assert parse_key(struct.pack(">hh", 1, 1) + b"x") is None
    assert parse_key(None) is None


@pytest.mark.parametrize("version", [0, 1])
def test_both_value_versions_parse_to_the_same_entry(version):
    parts = {"q": [0, 3], OFFSETS_TOPIC: [17]}
    entry = parse_value(value(version, 4001, 7, TxnState.PREPARE_COMMIT, parts))
    assert entry == TxnLogEntry(4001, 7, TxnState.PREPARE_COMMIT, frozenset({("q", 0), ("q", 3), (OFFSETS_TOPIC, 17)}))
    assert parse_value(value(version, 4001, 8, TxnState.EMPTY, None)).partitions == frozenset()


def test_tagged_fields_of_version_1_are_skipped():
    tags = uvarint(2) + uvarint(0) + uvarint(8) + struct.pack(">q", 99) + uvarint(2) + uvarint(2) + b"\x00\x02"
    entry = parse_value(value(1, 5, 1, TxnState.COMPLETE_ABORT, {}, tagged=tags))
    assert entry.state is TxnState.COMPLETE_ABORT and entry.producer_id == 5


def test_unknown_versions_states_and_short_records_are_typed_errors():
    good = value(0, 1, 1, TxnState.ONGOING, {"q": [1]})
    with pytest.raises(TxnLogFormatError, match="version 9"):
        parse_value(struct.pack(">h", 9) + good[2:])
    with pytest.raises(TxnLogFormatError, match="state 42"):
        parse_value(good[:16] + bytes([42]) + good[17:])
    with pytest.raises(TxnLogFormatError, match="ends early"):
        parse_value(good[:-3])


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_the_typed_error(data):
    try:
        parse_value(data)
    except TxnLogFormatError:
        pass
    try:
        parse_key(data)
    except TxnLogFormatError:
        pass


def test_the_partition_is_javas_string_hash_made_positive():
    assert partition_of("abc", 50) == 96354 % 50  # "abc".hashCode() == 96354
    assert partition_of("Aa", 7) == partition_of("BB", 7)  # equal Java hashes (2112)
    assert partition_of("polygenelubricants", 50) == 0  # hashCode() == Integer.MIN_VALUE: abs gives 0
    assert partition_of("zzzzzzzz", 50) == 1910022912 % 50  # hashCode() == -1910022912: its absolute value
    with pytest.raises(ValueError):
        partition_of("x", 0)


def e(state: TxnState, epoch: int = 1, *parts: tuple[str, int]) -> TxnLogEntry:
    return TxnLogEntry(9, epoch, state, frozenset(parts))


S = TxnState
OFF = (OFFSETS_TOPIC, 3)


def test_a_commit_before_the_init_is_read_with_its_data_partitions():
    history = [
        e(S.EMPTY),
        e(S.ONGOING, 1, ("q", 0)),
        e(S.PREPARE_COMMIT, 1, ("q", 0)),
        e(S.COMPLETE_COMMIT),
        e(S.ONGOING, 1, ("r", 1)),
        e(S.ONGOING, 1, ("r", 1), OFF),
        e(S.PREPARE_COMMIT, 1, ("r", 1), OFF),
        e(S.COMPLETE_COMMIT),
        e(S.EMPTY, 2),
    ]
    assert outcome_before_init(history) == Outcome(True, frozenset({("r", 1)}))


def test_an_open_transaction_fenced_by_the_init_is_aborted():
    history = [
        e(S.EMPTY),
        e(S.ONGOING, 1, ("q", 2), OFF),
        e(S.PREPARE_EPOCH_FENCE, 2, ("q", 2), OFF),
        e(S.PREPARE_ABORT, 2, ("q", 2), OFF),
        e(S.COMPLETE_ABORT, 2),
        e(S.EMPTY, 3),
        e(S.EMPTY, 4),
    ]
    assert outcome_before_init(history) == Outcome(False, frozenset({("q", 2)}))


def test_the_log_does_not_say_without_an_init_after_or_a_decision_before_it():
    assert outcome_before_init([]) is None
    assert outcome_before_init([e(S.ONGOING, 1, OFF), e(S.PREPARE_COMMIT, 1, OFF)]) is None  # no init yet
    assert outcome_before_init([e(S.EMPTY), e(S.EMPTY, 2)]) is None  # nothing began
    assert outcome_before_init([e(S.ONGOING, 1, OFF), e(S.EMPTY, 2)]) is None  # undecided, impossible


def test_the_log_is_asked_after_a_quiet_spell_then_no_more_often():
    now = [100.0]
    check = OpenTransactionCheck(after=10.0, clock=lambda: now[0])
    assert not check.due()  # the first unreadable answer starts the spell
    now[0] = 109.9
    assert not check.due()
    now[0] = 110.0
    assert check.due()
    now[0] = 115.0
    assert not check.due()
    now[0] = 120.0
    assert check.due()
    assert check.first_failure() and not check.first_failure()
