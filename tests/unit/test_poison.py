"""Poison-message policy (kbroker.core.receive.poison): five rolled-back receives in a row disable a queue."""

from __future__ import annotations

from kbroker.core.receive.poison import POISON_THRESHOLD, DisableQueue, PoisonCounter, RollbackLedger


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


# --- per message, across processes -------------------------------------------------------------


def test_a_messages_rollbacks_add_up_whoever_counted_them() -> None:
    ledger = RollbackLedger()
    m = ("topic", 0, 7)
    ledger.seen(m, 3)  # another process rolled it back three times
    ledger.seen(m, 2)  # an older event read late changes nothing
    assert ledger.rolled_back([m]) == {m: 4}
    counts = ledger.rolled_back([m, ("topic", 0, 8)])
    assert counts == {m: 5, ("topic", 0, 8): 1}
    verdict = ledger.verdict("Q", counts, poison_message_handling=True)
    assert verdict == DisableQueue("Q", 5, "0:7")
    assert verdict.reason == "the message at 0:7 was rolled back 5 times"
    assert ledger.verdict("Q", counts, poison_message_handling=False) is None
    assert ledger.verdict("Q", {m: 4}, poison_message_handling=True) is None


def test_a_committed_message_is_forgotten_and_the_ledger_stays_bounded() -> None:
    ledger = RollbackLedger(limit=3)
    for offset in range(5):
        ledger.rolled_back([("t", 0, offset)])
    assert [ledger.count(("t", 0, o)) for o in range(5)] == [0, 0, 1, 1, 1]  # the oldest went first
    ledger.forget([("t", 0, 4)])
    assert ledger.count(("t", 0, 4)) == 0


def test_a_poison_verdict_outside_the_catalog_holds_until_the_queue_is_enabled():
    from kbroker.core.receive.poison import EventDisables

    d = EventDisables()
    verdict = {"event": "QUEUE_DISABLED", "queue": "q", "poison": True, "catalog": False}
    d.seen(verdict)
    assert d.disabled("q") and not d.disabled("other")
    d.seen({"event": "QUEUE_ENABLED", "queue": "other"})
    assert d.disabled("q")
    d.seen({"event": "QUEUE_ENABLED", "queue": "q"})
    assert not d.disabled("q")


def test_only_a_poison_verdict_the_catalog_could_not_take_counts():
    from kbroker.core.receive.poison import EventDisables

    d = EventDisables()
    for event in (
        {"event": "QUEUE_DISABLED", "queue": "q", "poison": True},  # the catalog holds it
        {"event": "QUEUE_DISABLED", "queue": "q", "poison": False, "catalog": False},  # an operator's
        {"event": "QUEUE_DISABLED", "queue": 7, "poison": True, "catalog": False},
        ["QUEUE_DISABLED"],
        None,
        "QUEUE_DISABLED",
    ):
        d.seen(event)
    assert not d.disabled("q")
