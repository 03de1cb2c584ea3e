"""A batch step that fails transiently is tried again within the batch (analytics/failures.py): its
rows' transfer to the driver, its results' transaction. One failure used to fail the batch, and
with it the query."""

from __future__ import annotations

import threading

import pytest

from kbroker.analytics.failures import BATCH_STEP_ATTEMPTS, again_on_failure
from kbroker.errors import BrokerUnavailableError, PermissionDeniedError


def failing(times: int, calls: list[int], error: Exception):
    def step() -> list[str]:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return ["row"]

    return step


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(threading.Event, "wait", lambda self, t=None: False)


def test_a_failed_step_is_tried_again_and_the_batch_goes_on():
    calls: list[int] = []
    step = failing(BATCH_STEP_ATTEMPTS - 1, calls, OSError("serve-Arrow: Accept timed out"))
    assert again_on_failure("reading", step, 7, threading.Event()) == ["row"]
    assert len(calls) == BATCH_STEP_ATTEMPTS


@pytest.mark.parametrize(
    "error, tries",
    [
        (BrokerUnavailableError("no broker"), BATCH_STEP_ATTEMPTS),  # every try fails: the batch fails
        # The authorizer's refusal stands until an operator grants the ACL: it fails the batch at once.
        (PermissionDeniedError("denied"), 1),
    ],
)
def test_a_step_that_keeps_failing_fails_the_batch_after_its_tries(error, tries):
    calls: list[int] = []
    with pytest.raises(type(error)):
        again_on_failure(
            "writing", failing(100, calls, error), 7, threading.Event(), retriable=(BrokerUnavailableError,)
        )
    assert len(calls) == tries


def test_a_stopping_job_does_not_try_again():
    calls: list[int] = []
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(OSError):
        again_on_failure("reading", failing(1, calls, OSError("x")), 7, stopping)
    assert len(calls) == 1


@pytest.mark.parametrize("where", [{"checkpoint": "s3a://bucket/ckpt"}, {"history": "hdfs://nn:8020/history"}])
def test_a_checkpoint_or_history_given_as_a_url_is_refused_not_made_a_local_directory(where):
    from pathlib import Path

    from kbroker.analytics.job import JobSettings
    from kbroker.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="not a URL"):
        JobSettings(cluster="127.0.0.1:9092", namespace="n", **{k: Path(v) for k, v in where.items()})
    JobSettings(
        cluster="127.0.0.1:9092", namespace="n", checkpoint=Path("/mnt/shared/ckpt"), history=Path("relative/history")
    )  # paths are taken
