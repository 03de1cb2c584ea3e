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
