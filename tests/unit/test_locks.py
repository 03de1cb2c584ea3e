"""SEND's conversation locks as pure logic: one owner at a time, re-entrant for that owner,
released only by it, and a waiter that gives up raises a retriable error naming the handle."""

import threading

import pytest

from kbroker.core.locks import ConversationLocks
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
