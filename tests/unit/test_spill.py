"""The endpoint cache's two-tier maps (kafka/dialogs/spill.py) against a plain dict: any sequence
of operations gives the same answers, entries beyond the memory tier live on disk, and memory
holds no more than the tier allows."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.dialogs.conversation_endpoint import Endpoint
from kbroker.kafka.dialogs.spill import SpillMap, SpillStore

pytestmark = pytest.mark.unit

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(0, 99)),
        st.tuples(st.just("get"), KEYS, st.none()),
        st.tuples(st.just("pop"), KEYS, st.none()),
        st.tuples(st.just("in"), KEYS, st.none()),
        st.tuples(st.just("setdefault"), KEYS, st.integers(0, 99)),
        st.tuples(st.just("below"), st.none(), st.integers(0, 99)),
        st.tuples(st.just("items"), st.none(), st.none()),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 5), st.booleans())
def test_a_spill_map_answers_as_a_dict_does(ops, hot, ordered):
    store = SpillStore()
    m: SpillMap[int] = SpillMap(store, "t", hot, ordered=ordered)
    model: dict[str, int] = {}
    try:
        for op, key, value in ops:
            if op == "set":
                m[key] = value
                model[key] = value
            elif op == "get":
                assert m.get(key, -1) == model.get(key, -1)
            elif op == "pop":
                assert m.pop(key, -1) == model.pop(key, -1)
            elif op == "in":
                assert (key in m) == (key in model)
            elif op == "setdefault":
                assert m.setdefault(key, value) == model.setdefault(key, value)
            elif op == "below" and ordered:
                assert sorted(m.below(value)) == sorted(k for k, v in model.items() if v < value)
            elif op == "items":
                assert sorted(m.items()) == sorted(model.items())
            assert len(m) == len(model)
            assert len(m._mem) <= m.hot + m._slack  # memory holds no more than its tier (and a batch)
    finally:
        store.close()


def test_endpoints_beyond_the_memory_tier_are_kept_on_disk_and_read_back():
    store = SpillStore()
    m: SpillMap[Endpoint] = SpillMap(store, "endpoints", 100)
    eps = {
        f"h{i}": Endpoint(f"h{i}", f"c{i}", "INITIATOR", f"g{i}", f"f{i}", "s", "t", "c", "SO", send_sequence=i)
        for i in range(1_000)
    }
    for h, ep in eps.items():
        m[h] = ep
    assert len(m) == 1_000 and m.in_memory <= 101 and m.spilled >= 899
    assert all(m[h] == ep for h, ep in eps.items())  # each read back equal, in any order
    assert m.read_back >= 899  # in insertion order nearly every read misses: the LRU's worst case
    written = m.spilled
    assert all(m[h] == ep for h, ep in list(eps.items())[:500])
    assert m.spilled == written  # read back unchanged: moved out again without a write
    assert sorted(m.keys()) == sorted(eps)
    store.close()


def test_a_hot_key_absent_from_a_spilled_map_is_looked_up_on_disk_once():
    store = SpillStore()
    m: SpillMap[int] = SpillMap(store, "t", 10)
    for i in range(100):
        m[str(i)] = i
    reads = []
    store.connection().set_trace_callback(reads.append)
    for _ in range(5):
        assert m.get("hot") is None and m.pop("hot", -1) == -1 and "hot" not in m
    assert len([r for r in reads if "SELECT" in r]) == 1
    store.close()


def test_a_small_map_never_opens_the_database():
    store = SpillStore()
    m: SpillMap[int] = SpillMap(store, "t", 10)
    for i in range(10):
        m[str(i)] = i
    assert m.pop("3") == 3 and "3" not in m
    assert not store.opened


def test_threads_sharing_a_map_lose_nothing():
    store = SpillStore()
    m: SpillMap[int] = SpillMap(store, "t", 50)

    def work(t: int) -> None:
        for i in range(2_000):
            m[f"{t}/{i}"] = i
            assert m[f"{t}/{i // 2}"] == i // 2

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(m) == 8_000
    assert sorted(m.items()) == sorted((f"{t}/{i}", i) for t in range(4) for i in range(2_000))
    store.close()


def test_a_bad_table_name_is_refused():
    with pytest.raises(ValueError, match="not a table name"):
        SpillMap(SpillStore(), "x; DROP TABLE y")
