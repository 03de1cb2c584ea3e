"""The machine a run measured on, and the command that ran it: reported with the results."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _kbroker_version() -> str:
    try:
        version = importlib.metadata.version("kbroker")
    except importlib.metadata.PackageNotFoundError:
        from kbroker import __version__ as version
    # The commit, and whether the package differs from it. Read-only: --no-optional-locks keeps
    # `git status` from refreshing the index. Nothing is added outside a checkout.
    package = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=package, timeout=5
        )
        if rev.returncode == 0 and rev.stdout.strip():
            changed = subprocess.run(
                ["git", "--no-optional-locks", "status", "--porcelain", "--", "."],
                capture_output=True,
                text=True,
                cwd=package,
                timeout=10,
            )
            dirty = ", with uncommitted changes" if changed.returncode == 0 and changed.stdout.strip() else ""
            version += f" ({rev.stdout.strip()}{dirty})"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def describe_machine(kafka_version: str) -> dict:
    """The CPU, memory, load, OS and the versions the run measured with."""
    from kbroker.kafka.clients import (
        library_versions,  # loaded when a run starts, not on import
    )

    ck, librdkafka = library_versions()
    vm = psutil.virtual_memory()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(vm.total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kafka": kafka_version,
        "confluent_kafka": f"{ck} (librdkafka {librdkafka})",
        "kbroker": _kbroker_version(),
    }


def command_line() -> str:
    """How this run was started, for the results' `command`."""
    if not sys.argv:
        return "kbroker bench"
    prog = Path(sys.argv[0]).name
    args = ["python -m kbroker" if prog == "__main__.py" else prog, *sys.argv[1:]]
    return " ".join(args)
