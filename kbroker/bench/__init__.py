"""`kbroker bench`: kbroker measured side by side with a plain-Kafka baseline in the same run,
on the same broker, reported as ratios (medians of R repetitions).

    harness.py    scenario registry, repetition and medians, machine description, results files
    scenarios.py  the scenarios: send (+ send-pipelined), request-reply, io-bound, backlog-rss
    activation.py activation-latency and activation-drain, with a real `kbroker worker`
    procedures.py the activation procedures those run

docs/benchmarks.md says what each scenario measures and holds the latest results table."""

from .harness import SCENARIOS, BenchContext, run_bench

__all__ = ["SCENARIOS", "BenchContext", "run_bench"]
