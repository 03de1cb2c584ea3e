"""Unit tests: no Kafka broker, no JVM, no network. Every test collected here is marked `unit`
(`pytest -m unit`); the broker fixtures are not visible from this folder."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees every item of the session: mark only those collected under this folder.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _no_broker_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue receiver built over a stand-in consumer would otherwise ask its (made-up) bootstrap
    for the brokers' minimum session time-out and wait out that call's 10 s deadline: the forced
    classic protocol asks nobody (kafka/receive/group_protocol.py). Tests of that choice unset it."""
    monkeypatch.setenv("KBROKER_GROUP_PROTOCOL", "classic")
