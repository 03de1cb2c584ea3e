#!/usr/bin/env python
"""What kbroker's Prometheus metrics cost: `kbroker bench` scenarios run alternately with the
metrics as they are and with every update a no-op (kbroker.metrics.of replaced), and kbroker's
own rate and CPU per message compared, medians over the rounds. The figures of
docs/benchmarks.md ("What the metrics cost").

    PYTHONPATH=. .venv/bin/python scripts/metrics_overhead.py --bootstrap HOST:PORT
        [--scenarios send,request-reply] [--messages 5000] [--rounds 5]

Each run is `kbroker bench SCENARIO... --repeat 1` in a process of its own, "on" then "off" in
each round, so the machine's drift falls on both alike. The baseline's rows are left aside: the
question is kbroker against itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile


class _Noop:
    def inc(self, *_a: object, **_k: object) -> None: ...
    def dec(self, *_a: object, **_k: object) -> None: ...
    def set(self, *_a: object, **_k: object) -> None: ...
    def observe(self, *_a: object, **_k: object) -> None: ...


def run_cli(mode: str, argv: list[str]) -> None:
    """The kbroker CLI with metrics `mode` ("on" or "off")."""
    import kbroker.metrics as metrics

    if mode == "off":
        noop = _Noop()
        metrics.of = lambda _family, *_labels: noop  # type: ignore[assignment]
    from kbroker.cli import main

    sys.argv = ["kbroker", *argv]
    main()


def one(mode: str, bootstrap: str, scenarios: list[str], messages: int) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="kbroker-metrics-") as out:
        argv = [
            "bench",
            *scenarios,
            "--messages",
            str(messages),
            "--repeat",
            "1",
            "--no-docs",
            "--out",
            out,
            "--bootstrap",
            bootstrap,
            "--quiet",
            "--json",
        ]
        done = subprocess.run(
            [sys.executable, __file__, "--cli", mode, *argv], capture_output=True, text=True, check=True, timeout=1800
        )
    rows = json.loads(done.stdout)["results"]
    return {
        r["scenario"]: {
            "rate": r["kbroker"],
            "cpu_ms": (r.get("runs") or [{}])[0].get("kbroker_detail", {}).get("cpu_ms_per_msg"),
        }
        for r in rows
    }


def main() -> int:
    if sys.argv[1:2] == ["--cli"]:
        run_cli(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--scenarios", default="send,request-reply")
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    scenarios = args.scenarios.split(",")
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.rounds):
        for mode in ("on", "off"):
            runs[mode].append(one(mode, args.bootstrap, scenarios, args.messages))
            print(f"round {i + 1} {mode}: {runs[mode][-1]}", file=sys.stderr)
    report = {}
    for scenario in runs["on"][0]:
        med = {
            mode: {
                k: statistics.median(r[scenario][k] for r in runs[mode] if r[scenario][k] is not None)
                for k in ("rate", "cpu_ms")
            }
            for mode in runs
        }
        report[scenario] = {
            **med,
            "rate_on_over_off": round(med["on"]["rate"] / med["off"]["rate"], 3),
            "cpu_on_over_off": round(med["on"]["cpu_ms"] / med["off"]["cpu_ms"], 3),
        }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
