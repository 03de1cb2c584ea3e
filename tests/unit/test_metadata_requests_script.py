"""scripts/metadata_requests.py reads a broker's request log as untrusted text: garbage, JSON of
another shape and an oversize line are skipped and counted, and the requests around them are
counted as before."""

from __future__ import annotations

import importlib.util
import json

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("metadata_requests", ROOT / "scripts" / "metadata_requests.py")
assert spec is not None and spec.loader is not None
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def request(api: str, topics: object = None, answered: int = 0) -> str:
    body = {
        "requestHeader": {"requestApiKeyName": api},
        "request": {"topics": topics},
        "response": {"topics": [{"name": f"t{i}"} for i in range(answered)]},
    }
    return script.PREFIX + json.dumps(body)


def test_forged_lines_are_skipped_and_the_requests_around_them_counted():
    lines = [
        request("METADATA", None, answered=3),
        "garbage \x00\xff",
        script.PREFIX + "{not json",
        script.PREFIX + "[1, 2, 3]",  # JSON, not an object
        script.PREFIX + json.dumps({"requestHeader": {"requestApiKeyName": 7}}),  # a name that is no string
        script.PREFIX + json.dumps({"requestHeader": "x"}),
        script.PREFIX
        + json.dumps(
            {"requestHeader": {"requestApiKeyName": "METADATA"}, "request": "x", "response": {"topics": 5}}
        ),  # forged shapes inside
        script.PREFIX + "x" * 1_000_000,  # oversize
        request("METADATA", [{"name": "a"}], answered=1),
        request("METADATA", []),
        request("FETCH"),
    ]
    counts = script.count(lines)
    assert counts["skipped_lines"] == 6
    assert counts["requests_by_api"] == {"METADATA": 4, "FETCH": 1}
    assert counts["metadata_requests"] == {"every topic": 2, "named topics": 1, "brokers only": 1}
    assert counts["metadata_topic_entries"] == {"every topic": 3, "named topics": 1, "brokers only": 0}
