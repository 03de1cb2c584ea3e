"""The scenarios `kbroker bench` (cli/bench.py) takes, and the check that what a run asks for
can run: the activation and analytics scenarios and `bench scale`'s queue and worker curves run
a real `kbroker worker`. Apart from the command: its names and prerequisites, not its options or
its run."""

from __future__ import annotations

import importlib.util

from kbroker.cli.common import fail, missing_extra

SCENARIO_NAMES = (
    "send",
    "send-pipelined",
    "request-reply",
    "request-reply-batched",
    "round-trip",
    "round-trip-10-dialogs",
    "limits",
    "limit-produce",
    "limit-latency",
    "io-bound",
    "io-bound-batched",
    "io-bound-2-processes",
    "io-bound-4-processes",
    "io-bound-serial",
    "backlog-rss",
    "ended-dialogs",
    "ended-dialogs-rss",
    "conversations-view",
    "activation-latency",
    "activation-drain",
    "analytics",
    "analytics-throughput",
    "analytics-throughput-pipelined",
    "analytics-stale-delay",
    "routing",
    "routing-request-reply-namespaces",
    "routing-request-reply-clusters",
    "routing-transmission-latency",
    "routing-secured",
    "routing-secured-round-trips",
    "transport",
    "transport-send",
    "transport-receive",
    "transport-io-bound",
    "transport-share-group",
    "transport-delayed",
    "transport-publish",
    "transport-outbox",
    "scale",
)


def require_worker_for_activation(scenarios: tuple[str, ...]) -> None:
    # The activation scenarios run a real `kbroker worker`: without Faust they could only fail,
    # after the other scenarios have taken minutes. Say so at once, in one line.
    activation = [s for s in scenarios or SCENARIO_NAMES if s.startswith(("activation", "analytics"))]
    if activation:
        require_worker(f"or name only scenarios other than {', '.join(activation)}")


def require_worker(otherwise: str) -> None:
    """One line, at once, when what is asked runs a real `kbroker worker` and Faust is missing."""
    missing = [p for p in ("faust", "aiokafka") if importlib.util.find_spec(p) is None]
    if missing:
        fail(f"{missing_extra(missing[0], 'bench')}, {otherwise}")
