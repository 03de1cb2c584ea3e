"""ALTER MESSAGE TYPE leaves queued messages be (core/catalog/drops.stamp_validations and
MessageType.validation_at): apply keeps the replaced validations, newest first, and a message is
checked on RECEIVE by the one in force when it was queued."""

from __future__ import annotations

from kbroker.core.catalog.drops import stamp_validations
from kbroker.core.catalog.models import Catalog


def cat(validation: str, earlier: list | None = None) -> Catalog:
    mt = {"name": "M", "validation": validation, **({"earlier": earlier} if earlier else {})}
    return Catalog.model_validate({"namespace": "ns", "message_types": {"M": mt}})


def test_a_changed_validation_keeps_the_one_it_replaced_and_an_unchanged_one_nothing_new():
    first = stamp_validations(cat("NONE"), cat("NONE"), 100.0)
    assert first.message_types["M"].earlier == []
    second = stamp_validations(cat("JSON"), first, 200.0)
    mt = second.message_types["M"]
    assert [(e.until, e.validation) for e in mt.earlier] == [(200.0, "NONE")]
    again = stamp_validations(cat("JSON"), second, 300.0)
    assert again.message_types["M"] == mt  # re-applying publishes nothing new
    third = stamp_validations(cat("EMPTY"), again, 400.0)
    assert [(e.until, e.validation) for e in third.message_types["M"].earlier] == [(400.0, "JSON"), (200.0, "NONE")]


def test_the_validation_in_force_when_a_message_was_queued():
    mt = cat("EMPTY", [{"until": 400.0, "validation": "JSON"}, {"until": 200.0, "validation": "NONE"}]).message_types[
        "M"
    ]
    assert mt.validation_at(150_000)[0] == "NONE"
    assert mt.validation_at(250_000)[0] == "JSON"
    assert mt.validation_at(450_000)[0] == "EMPTY"
    assert mt.validation_at(None)[0] == "EMPTY"


def test_at_most_four_are_kept():
    c = cat("NONE")
    for i, v in enumerate(["JSON", "EMPTY", "NONE", "JSON", "EMPTY", "NONE"]):
        c = stamp_validations(cat(v), c, float(i + 1))
    assert [e.until for e in c.message_types["M"].earlier] == [6.0, 5.0, 4.0, 3.0]
    assert "earlier" not in cat("NONE").message_types["M"].model_dump()  # written only when set
