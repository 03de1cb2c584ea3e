"""The analytics job's state files (analytics/state_files.py): one file per batch, the newest
before a batch is the one a replayed batch starts from."""

from __future__ import annotations

from pathlib import Path

from kbroker.analytics.state_files import KEEP, StateFiles


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_nothing_saved_starts_empty(tmp_path):
    files = StateFiles(tmp_path / "kbroker-state")
    assert (tmp_path / "kbroker-state").is_dir()
    assert files.load_before(0) is None
    assert files.load_before(7) is None


def test_the_newest_state_strictly_before_the_batch(tmp_path):
    files = StateFiles(tmp_path)
    files.save(4, {"n": 4})
    files.save(5, {"n": 5})
    assert files.load_before(6) == (5, {"n": 5})
    assert files.load_before(5) == (4, {"n": 4})  # batch 5 run again starts from 4's state
    assert files.load_before(4) is None
    assert files.load_before(100) == (5, {"n": 5})


def test_the_state_comes_back_as_saved(tmp_path):
    state = {
        "now": 1764000000123,
        "parts": [["Q", 0, -1, [3, 5], 7, [[4, 1764000000000, "g", "c/TARGET"]]]],
        "timers": {"t": "c/TARGET"},
        "gauge": 0.125,
        "none": None,
    }
    StateFiles(tmp_path).save(9, state)
    assert StateFiles(tmp_path).load_before(10) == (9, state)  # another instance: read from disk


def test_only_the_newest_files_are_kept(tmp_path):
    assert KEEP == 3
    files = StateFiles(tmp_path)
    for b in range(6):
        files.save(b, {"n": b})
    assert files.batches() == [3, 4, 5]
    assert names(tmp_path) == ["3.state", "4.state", "5.state"]
    assert files.load_before(3) is None


def test_saving_a_batch_removes_later_ones(tmp_path):
    files = StateFiles(tmp_path)
    for b in (1, 2, 3):
        files.save(b, {"n": b})
    files.save(2, {"n": "2 again"})  # a run whose batch 3 Spark never committed
    assert files.batches() == [1, 2]
    assert files.load_before(3) == (2, {"n": "2 again"})
    assert files.load_before(2) == (1, {"n": 1})


def test_saving_before_several_later_files_keeps_the_one_just_saved(tmp_path):
    files = StateFiles(tmp_path)
    for b in (1, 3, 4, 5):
        (tmp_path / f"{b}.state").write_bytes(b"")  # left by an older run; never read
    files.save(2, {"n": 2})
    assert files.batches() == [1, 2]
    assert files.load_before(3) == (2, {"n": 2})


def test_a_leftover_temp_file_is_ignored(tmp_path):
    files = StateFiles(tmp_path)
    files.save(1, {"n": 1})
    (tmp_path / ".state-abc123").write_bytes(b"half a state, then kill -9")
    (tmp_path / "7.state.tmp").write_bytes(b"not a state either")
    assert files.batches() == [1]
    assert files.load_before(9) == (1, {"n": 1})
    files.save(2, {"n": 2})
    assert files.load_before(9) == (2, {"n": 2})
    assert "3.state" not in names(tmp_path) and files.batches() == [1, 2]


def test_no_temp_file_is_left_by_a_save(tmp_path):
    files = StateFiles(tmp_path)
    files.save(1, {"n": 1})
    files.save(2, {"n": 2})
    assert names(tmp_path) == ["1.state", "2.state"]
