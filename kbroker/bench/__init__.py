"""`kbroker bench`: kbroker measured side by side with a plain-Kafka baseline in the same run,
on the same broker, reported as ratios (medians of R repetitions).

    harness.py          runs the scenarios' repetitions on one broker (the entry point)
    registry.py         what a scenario is, the registry, scenario names
    results.py          medians and ratios, the results file, the docs table
    progress.py         progress on stderr;  machine.py  the machine description
    common.py           the sample service's records and helpers the scenarios share
    scenarios/          one module per scenario, each beside its baseline: send.py (+ send-pipelined),
                        reply.py, io.py, rss.py (backlog-rss), endpoints.py (ended-dialogs),
                        activation_latency.py, activation_drain.py, analytics.py, routing.py,
                        transport.py
    scale/              `kbroker bench scale`: run.py, many_queues.py, dialogs.py, workers.py, plot.py
    activation.py       the `kbroker worker` the activation scenarios run, and its monitor rows
    procedures.py       the activation procedures those run
    params.py           the sizes and settings (Params) and their defaults

The baselines' Kafka clients come from kbroker.kafka (clients.py, baseline.py), with their own
settings.

docs/benchmarks.md says what each scenario measures and holds the latest results table."""

__all__ = ["SCENARIOS", "BenchContext", "run_bench"]


def __getattr__(name: str):
    # Loaded on first use: `kbroker bench` reads its option defaults from params.py without
    # paying for the harness (rich, psutil) on every kbroker command.
    if name in __all__:
        from kbroker.bench import harness

        return getattr(harness, name)
    raise AttributeError(name)
