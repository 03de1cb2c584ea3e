"""The scaling curves of OUT/scale.json as one PNG (matplotlib, the bench extra's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _series(points: list[dict[str, Any]], x: str, *path: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for p in points:
        v: Any = p
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if "error" not in p and isinstance(v, (int, float)):
            xs.append(p[x])
            ys.append(v)
    return xs, ys


# One panel each: (curve, x key, title, y label, [(label, path to the figure), ...], log x?)
Panel = tuple[str, str, str, str, list[tuple[str, tuple[str, ...]]], bool]
PANELS: tuple[Panel, ...] = (
    (
        "queues",
        "queues",
        "queues: start and apply",
        "s",
        [("worker start", ("worker_start_s",)), ("kbroker apply", ("apply_s",))],
        False,
    ),
    ("queues", "queues", "queues: worker RSS", "MB", [("worker RSS", ("worker_rss_mb",))], False),
    (
        "queues",
        "queues",
        "queues: latencies",
        "ms",
        [
            ("activation p99", ("activation_ms", "p99")),
            ("activation p50", ("activation_ms", "p50")),
            ("tick p50", ("tick_ms", "p50")),
        ],
        False,
    ),
    (
        "dialogs",
        "dialogs",
        "open dialogs: throughput",
        "msg/s",
        [("BEGIN + SEND", ("send", "msg_per_s")), ("RECEIVE", ("receive", "msg_per_s"))],
        True,
    ),
    (
        "dialogs",
        "dialogs",
        "open dialogs: peak RSS",
        "MB",
        [("sender", ("send", "peak_rss_mb")), ("receiver", ("receive", "peak_rss_mb"))],
        True,
    ),
    (
        "workers",
        "workers",
        "workers: activated drain (5 ms I/O each)",
        "msg/s",
        [("drain rate", ("msg_per_s",))],
        False,
    ),
)


def plot(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (curve, x, title, unit, lines, log_x) in zip(axes.flat, PANELS):
        points = (doc.get("curves", {}).get(curve) or {}).get("points", [])
        for label, fig_path in lines:
            xs, ys = _series(points, x, *fig_path)
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        if curve == "queues" and unit == "ms":  # points where no activation answered at all
            missed = [
                p[x]
                for p in points
                if "error" not in p
                and (p.get("activation_ms") or {}).get("missed")
                and not (p.get("activation_ms") or {}).get("samples")
            ]
            if missed:
                ax.scatter(missed, [0] * len(missed), marker="x", s=80, color="red", label="activation missed")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(x)
        ax.set_ylabel(unit)
        if log_x:
            ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    machine: dict[str, Any] = next((c.get("machine") for c in doc.get("curves", {}).values() if c.get("machine")), {})
    dates = sorted(c["date"][:10] for c in doc.get("curves", {}).values() if c.get("date"))
    fig.suptitle(
        f"kbroker bench scale: one Kafka broker, {machine.get('cores', '?')} cores"
        + (f", {dates[-1]}" if dates else "")
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
