#!/usr/bin/env python
"""What clients asked a broker, from its request log: requests by API, and the metadata
requests split into those naming topics and those asking for every topic, with the topic
entries their answers carried (docs/benchmarks.md, "Sixteenth round").

    KBROKER_BROKER_JAVA_OPTS="-Dlog4j2.configurationFile=$PWD/kbroker/embedded/log4j2.properties,\\
$PWD/scripts/request-log4j2.properties -Dkbroker.request.log=/tmp/requests.log" \\
        .venv/bin/kbroker broker start --port 19300 --data-dir /tmp/request-broker
    KBROKER_BOOTSTRAP=127.0.0.1:19300 .venv/bin/pytest -q tests/integration/test_messaging.py
    .venv/bin/python scripts/metadata_requests.py /tmp/requests.log [--json]

A line that is not a completed request (not JSON, or JSON of another shape) is counted and
skipped; a request whose topics are not a list counts as one for every topic.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

PREFIX = "Completed request:"


def completed(line: str) -> dict[str, Any] | None:
    """The completed request a line logs, or None: the line is read as untrusted (any text,
    JSON of any shape, any size)."""
    if not line.startswith(PREFIX):
        return None
    try:
        done = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    header = done.get("requestHeader") if isinstance(done, dict) else None
    if not isinstance(header, dict) or not isinstance(header.get("requestApiKeyName"), str):
        return None
    return done


def listed(value: Any, key: str) -> list[Any] | None:
    """value[key] when value is a JSON object and that is a list, else None."""
    got = value.get(key) if isinstance(value, dict) else None
    return got if isinstance(got, list) else None


def count(lines: Any) -> dict[str, Any]:
    """Requests by API name; metadata requests and their answers' topic entries by kind."""
    by_api: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    skipped = 0
    for line in lines:
        done = completed(line)
        if done is None:
            skipped += 1
            continue
        api = done["requestHeader"]["requestApiKeyName"]
        by_api[api] += 1
        if api != "METADATA":
            continue
        asked = listed(done.get("request"), "topics")
        kind = "every topic" if asked is None else ("brokers only" if not asked else "named topics")
        requests[kind] += 1
        entries[kind] += len(listed(done.get("response"), "topics") or [])
    return {
        "requests_by_api": dict(by_api.most_common()),
        "metadata_requests": dict(requests),
        "metadata_topic_entries": dict(entries),
        "skipped_lines": skipped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the broker's request log")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    with args.log.open(errors="replace") as lines:
        counts = count(lines)
    if args.json:
        print(json.dumps(counts))
        return
    print("requests by API:", ", ".join(f"{k} {v}" for k, v in list(counts["requests_by_api"].items())[:8]))
    for kind, n in counts["metadata_requests"].items():
        print(
            f"metadata, {kind}: {n} requests, {counts['metadata_topic_entries'].get(kind, 0)} topic entries "
            "in their answers"
        )
    if counts["skipped_lines"]:
        print(f"{counts['skipped_lines']} lines were not completed requests")


if __name__ == "__main__":
    main()
