"""JSON log lines (core/json_logs.py): one object a line, the fields a line is about copied out,
whatever the message holds."""

from __future__ import annotations

import logging
import sys

import orjson
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.json_logs import JsonFormatter


def record(msg: str, *args: object, level: int = logging.INFO, exc_info=None, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("kbroker.worker", level, __file__, 1, msg, args, exc_info)
    r.__dict__.update(extra)
    return r


def test_a_line_carries_the_process_fields_and_what_it_names():
    f = JsonFormatter(namespace="shop", worker="w1", unused=None)
    line = orjson.loads(f.format(record("launch reader queue=%s generation=%s procedure=%s", "Orders", 3, "app:run")))
    assert line["message"] == "launch reader queue=Orders generation=3 procedure=app:run"
    assert (line["level"], line["logger"], line["namespace"], line["worker"]) == (
        "INFO",
        "kbroker.worker",
        "shop",
        "w1",
    )
    assert (line["queue"], line["generation"], line["procedure"]) == ("Orders", "3", "app:run")
    assert "unused" not in line and line["time"].endswith("+00:00")


def test_extra_fields_win_and_unknown_keys_stay_in_the_message():
    f = JsonFormatter(namespace="shop")
    line = orjson.loads(f.format(record("moved queue=A colour=red", queue="B", conversation="c-1")))
    assert line["queue"] == "B" and line["conversation"] == "c-1"
    assert "colour" not in line


def test_an_exception_is_one_field_of_one_line():
    f = JsonFormatter()
    try:
        raise ValueError("bad\nrecord")
    except ValueError:
        text = f.format(record("failed", level=logging.ERROR, exc_info=sys.exc_info()))
    assert "\n" not in text
    line = orjson.loads(text)
    assert line["level"] == "ERROR" and "ValueError: bad\nrecord" in line["exception"]


@given(st.text(), st.lists(st.sampled_from(["queue", "dialog", "topic", "x"]), max_size=3))
def test_any_message_is_one_valid_json_line_holding_it(message, keys):
    msg = message + " " + " ".join(f"{k}={v}" for k, v in zip(keys, ("a", "b", "c")))
    text = JsonFormatter(namespace="n").format(record(msg))  # no args: the message is taken as written
    assert "\n" not in text
    assert orjson.loads(text)["message"] == msg
