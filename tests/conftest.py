"""Settings for the whole test session. The Kafka broker fixtures live in
tests/integration/conftest.py, so `pytest tests/unit` never starts a broker; helpers that tests
import live in tests.helpers."""

from __future__ import annotations

import signal
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # A run ended by SIGTERM (a CI time-out, `timeout`) still tears its fixtures down, so the
    # embedded broker it started does not outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


_EXIT_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS["status"] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's result is decided and reported: leave without the interpreter's own teardown.
    A whole session leaves Kafka clients of many tests behind whose librdkafka threads still run,
    and OpenSSL's exit-time cleanup (librdkafka carries its own copy) raced one of them once
    (a segmentation fault in init_thread_deregister after '587 passed', which failed the run).
    Fixtures have been torn down by now: the embedded broker and workers are stopped."""
    if "status" not in _EXIT_STATUS:
        return
    import gc
    import os

    try:
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient

        live = sum(isinstance(o, (Producer, Consumer, AdminClient)) for o in gc.get_objects())
        sys.stderr.write(f"kafka clients still open at the end of the session: {live}\n")
    except ImportError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["status"])
