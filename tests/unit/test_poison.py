"""Poison-message policy (kbroker.core.poison): five rolled-back receives in a row disable a queue."""

from __future__ import annotations

from kbroker.core.poison import POISON_THRESHOLD, DisableQueue, PoisonCounter


def rollbacks(counter: PoisonCounter, queue: str, times: int, handling: bool = True) -> list[DisableQueue | None]:
    return [counter.rolled_back(queue, poison_message_handling=handling) for _ in range(times)]


def test_the_fifth_consecutive_rollback_disables_the_queue_and_says_why() -> None:
    counter = PoisonCounter()
    counter.watch("Q")
    verdicts = rollbacks(counter, "Q", 6)
    assert POISON_THRESHOLD == 5
    assert verdicts[:4] == [None] * 4
    assert verdicts[4:] == [DisableQueue("Q", 5), DisableQueue("Q", 6)]  # and every rollback after it
    assert verdicts[4] is not None and verdicts[4].reason == "5 consecutive rolled-back receives"


def test_a_commit_or_re_enabling_starts_over() -> None:
    counter = PoisonCounter()
    counter.watch("Q")
    rollbacks(counter, "Q", 4)
    counter.reset("Q")
    assert counter.count("Q") == 0
    assert rollbacks(counter, "Q", 5) == [None] * 4 + [DisableQueue("Q", 5)]


def test_handling_off_counts_but_never_disables() -> None:
    counter = PoisonCounter()
    counter.watch("Q")
    assert rollbacks(counter, "Q", 7, handling=False) == [None] * 7
    assert counter.count("Q") == 7


def test_only_watched_queues_count_per_queue_and_forget_all_unwatches() -> None:
    counter = PoisonCounter(threshold=1)
    assert counter.rolled_back("Q", True) is None and counter.count("Q") == 0
    counter.reset("Q")  # resetting an unwatched queue does not start watching it
    assert not counter.watches("Q")
    counter.watch("Q")
    counter.watch("R")
    assert counter.rolled_back("Q", True) == DisableQueue("Q", 1)
    assert counter.count("R") == 0  # per queue
    counter.watch("Q")  # watching again keeps the count
    assert counter.count("Q") == 1
    counter.forget_all()
    assert not counter.watches("Q") and counter.rolled_back("Q", True) is None
