"""SEND's conversation locks as pure logic: one owner at a time, re-entrant for that owner,
released only by it, and a waiter that gives up raises a retriable error naming the handle."""

import threading
import time

import pytest

from kbroker.core.dialogs.locks import ConversationLocks
from kbroker.errors import ConversationLockTimeoutError


def test_one_owner_at_a_time_and_waiters_get_it_on_release():
    locks, a, b = ConversationLocks(timeout=5), object(), object()
    locks.lock("h", a)
    locks.lock("h", a)  # again: no-op for the holder
    got = threading.Event()
    t = threading.Thread(target=lambda: (locks.lock("h", b), got.set()))
    t.start()
    assert not got.wait(0.3)
    locks.release(["h"], b)  # not the holder: nothing happens
    assert not got.wait(0.3)
    locks.release(["h"], a)
    assert got.wait(5)
    t.join()


def test_a_waiter_gives_up_after_the_timeout():
    locks = ConversationLocks(timeout=0.2)
    locks.lock("h", object())
    locks.lock("other", object())  # other conversations are independent
    with pytest.raises(ConversationLockTimeoutError) as err:
        locks.lock("h", object())
    assert err.value.retriable and err.value.handle == "h"


def test_held_releases_even_when_the_statement_fails():
    locks = ConversationLocks(timeout=0.2)
    with pytest.raises(RuntimeError):
        with locks.held("h"):
            raise RuntimeError("statement failed")
    locks.lock("h", object())  # free again


def test_try_lock_takes_only_a_free_lock_and_never_waits():
    locks = ConversationLocks(timeout=30.0)
    holder, keeper = object(), object()
    locks.lock("h", holder)
    assert not locks.try_lock("h", keeper)  # the lease keeper leaves a held conversation alone
    locks.release(["h"], holder)
    assert locks.try_lock("h", keeper)
    assert not locks.try_lock("h", holder)


def test_under_contention_every_waiter_gets_the_lock_in_turn_and_never_two_at_once():
    """A release wakes a waiter of the handle it frees, not every waiting thread: no waiter is
    left asleep with the lock free, and no two owners ever hold one handle."""
    locks = ConversationLocks(timeout=10.0)
    inside = {"a": 0, "b": 0}
    overlaps, done = [], []

    def work(handle: str) -> None:
        for _ in range(200):
            me = object()
            locks.lock(handle, me)
            inside[handle] += 1
            if inside[handle] != 1:
                overlaps.append(handle)
            inside[handle] -= 1
            locks.release([handle], me)
        done.append(handle)

    threads = [threading.Thread(target=work, args=("ab"[i % 2],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(done) == 16 and not overlaps
    assert not locks._waiting  # every waiter's entry went with it


def test_a_release_wakes_only_the_waiters_of_the_handles_it_frees():
    locks = ConversationLocks(timeout=5.0)
    a, b = object(), object()
    locks.lock("a", a)
    locks.lock("b", b)
    got = threading.Event()
    t = threading.Thread(target=lambda: (locks.lock("b", object()), got.set()))
    t.start()
    while "b" not in locks._waiting:
        time.sleep(0.01)
    woken = []
    cv = locks._waiting["b"].cv
    original = cv.notify
    cv.notify = lambda n=1: (woken.append(n), original(n))  # type: ignore[method-assign]
    locks.release(["a"], a)
    assert not woken and not got.wait(0.2)
    locks.release(["b"], b)
    assert got.wait(5) and woken == [1]
    t.join()
