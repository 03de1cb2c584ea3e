"""The start-up purge's settings (sdk/transport/purge.py, StartupPurge): its time-out is checked
when the endpoint is made, and a purge that is off does nothing at start. No broker."""

from __future__ import annotations

import math

import pytest

from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.purge import PURGE_TIMEOUT, StartupPurge, purge_timeout


def test_the_default_is_off_with_a_30_second_bound() -> None:
    assert StartupPurge() == StartupPurge(False, 30.0) and PURGE_TIMEOUT == 30.0
    assert StartupPurge(True, 5).timeout == 5.0


@pytest.mark.parametrize("bad", [0, -1, 3600.5, math.nan, math.inf, True, "30", None])
def test_a_time_out_that_is_not_a_positive_number_of_seconds_up_to_an_hour_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="purge_timeout"):
        purge_timeout(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="purge_timeout"):
        StartupPurge(True, bad)  # type: ignore[arg-type]


def test_the_switch_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="purge_expired_on_startup"):
        StartupPurge("yes")  # type: ignore[arg-type]


def test_a_purge_that_is_off_touches_nothing() -> None:
    class Untouchable:
        @property
        def runtime(self) -> object:
            raise AssertionError("the purge is off: the runtime is not asked")

    assert StartupPurge(False).run(Untouchable()) == 0  # type: ignore[arg-type]
