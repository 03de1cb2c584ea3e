"""`kbroker bench`: kbroker measured side by side with a plain-Kafka baseline in the same run,
on the same broker, reported as ratios (medians of R repetitions).

    harness.py    scenario registry, repetition and medians, machine description, results files
    scenarios.py  the scenarios: send (+ send-pipelined), request-reply, io-bound, backlog-rss
    activation.py activation-latency and activation-drain, with a real `kbroker worker`
    procedures.py the activation procedures those run
    params.py     the sizes and settings (Params) and their defaults

docs/benchmarks.md says what each scenario measures and holds the latest results table."""

__all__ = ["SCENARIOS", "BenchContext", "run_bench"]


def __getattr__(name: str):
    # Loaded on first use: `kbroker bench` reads its option defaults from params.py without
    # paying for the harness (rich, psutil) on every kbroker command.
    if name in __all__:
        from kbroker.bench import harness

        return getattr(harness, name)
    raise AttributeError(name)
