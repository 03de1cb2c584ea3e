"""A reader of a topic the 5th-tick scan records (`Rejects(..., record=False, scanned=True)`: the
catalog's readers) skips a bad record at DEBUG, still counting it; the scan's Rejects, which
records it, says so at WARNING, and a reader no scan covers still warns (kafka/rejects.py). Before,
every read of the catalog warned again of records set aside long ago. No broker: a scripted
consumer (tests/integration/test_catalog_set_aside_once.py has the real one)."""

from __future__ import annotations

import logging

import pytest

from kbroker.core.rejected import Consumed
from kbroker.kafka.catalog.catalog_store import read_catalog_with
from kbroker.kafka.rejects import Rejects

from .fake_consumer import FakeConsumer, FakeMessage, eof

TOPIC = "kbroker.ns.catalog"


def levels(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.levelno for r in caplog.records if "set aside" in r.getMessage()]


def test_a_catalog_reader_notes_a_bad_record_at_debug_and_counts_it(caplog):
    records = [FakeMessage(0, 0, b"service/Bogus", b'{"name": 5}', topic_=TOPIC), eof(0, 1)]
    rejects = Rejects("127.0.0.1:1", "ns", "catalog reader", record=False, scanned=True)
    with caplog.at_level(logging.DEBUG, logger="kbroker.rejects"):
        catalog = read_catalog_with(
            FakeConsumer({0: (0, 1)}, [records]),
            "ns",
            [0],
            5.0,  # type: ignore[arg-type]
            rejects,
        )
    assert "Bogus" not in catalog.services and rejects.rejected == 1
    assert levels(caplog) == [logging.DEBUG]


@pytest.mark.parametrize(
    "made, level",
    [
        ({"record": False}, logging.WARNING),  # a reader no scan covers (the monitors view) still says so
        ({"record": False, "scanned": True}, logging.DEBUG),
        ({"record": True}, logging.WARNING),  # the scan's own, which records it: says so
        ({"record": True, "scanned": True}, logging.WARNING),
    ],
)
def test_who_says_so_at_warning(caplog, monkeypatch, made, level):
    rejects = Rejects("127.0.0.1:1", "ns", "a reader", **made)
    written: list[str] = []
    monkeypatch.setattr(rejects, "_write", lambda record, reason: written.append(reason))  # no broker
    with caplog.at_level(logging.DEBUG, logger="kbroker.rejects"):
        assert rejects.reject(Consumed(TOPIC, 0, 3, b"k", b"v"), "not JSON")
        assert not rejects.reject(Consumed(TOPIC, 0, 3, b"k", b"v"), "not JSON")  # once per position
    assert levels(caplog) == [level] and rejects.rejected == 1
    assert written == (["not JSON"] if made["record"] else [])
