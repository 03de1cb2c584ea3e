#!/usr/bin/env python3
"""Import cost of kbroker's entry points, as `python -X importtime` measures it: the median over N
fresh interpreters of the cumulative import time of each module, and the heavy third-party packages
its import loaded.

    PYTHONPATH=. scripts/importtime.py [--runs 7] [--python .venv/bin/python] [MODULE ...]

Each module is imported once first, untimed, so that the timed runs read bytecode as an installed
package does. The current directory comes first on the measured interpreter's path (`-c`).

The default modules: `kbroker` (the SDK facade), `kbroker.core.receive.offsets` (the pure core) and
`kbroker.cli` (everything `kbroker --help` imports). `import kbroker` and the core should load none
of the heavy packages; the CLI none of the optional ones (Faust, Spark)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

DEFAULT_MODULES = ("kbroker", "kbroker.core.receive.offsets", "kbroker.cli")
HEAVY = ("confluent_kafka", "pydantic", "faust", "aiokafka", "pyspark", "rich", "psutil", "httpx", "yaml")


def parse_importtime(stderr: str) -> dict[str, int]:
    """The cumulative microseconds of each module in `-X importtime` output, by module name.

    A line reads `import time: <self us> | <cumulative us> | <indented module name>`; the header
    line (`import time: self [us] | ...`) and anything else on stderr are skipped."""
    cumulative: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line.removeprefix("import time:").split("|")
        if len(fields) != 3 or not fields[1].strip().isdigit():
            continue
        cumulative[fields[2].strip()] = int(fields[1])
    return cumulative


def measure_once(python: str, module: str) -> tuple[float, set[str]]:
    """One fresh interpreter importing module: its cumulative import time in milliseconds, and the
    top-level packages imported on the way."""
    # Bytecode is written and reused, as in an installed package: without it every run would
    # measure compiling kbroker's sources rather than importing them.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(
        [python, "-X", "importtime", "-c", f"import {module}"], check=True, capture_output=True, text=True, env=env
    )
    cumulative = parse_importtime(proc.stderr)
    # A module already imported by the interpreter's start-up (site) has no line of its own:
    # then the import cost nothing here.
    return cumulative.get(module, 0) / 1000, {name.partition(".")[0] for name in cumulative}


def main() -> None:
    """Print one line per module: the median import time of the runs and the heavy packages."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per module (default 7)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    parser.add_argument("modules", nargs="*", default=list(DEFAULT_MODULES))
    args = parser.parse_args()
    for module in args.modules:
        timings: list[float] = []
        measure_once(args.python, module)  # the warm-up: writes the bytecode, fills the OS's file cache
        loaded: set[str] = set()
        for _ in range(args.runs):
            milliseconds, loaded = measure_once(args.python, module)
            timings.append(milliseconds)
        heavy = " ".join(name for name in HEAVY if name in loaded) or "-"
        print(
            f"import {module:<22} median {statistics.median(timings):7.1f} ms "
            f"(min {min(timings):.1f}, max {max(timings):.1f}, {args.runs} runs)   heavy: {heavy}"
        )


if __name__ == "__main__":
    main()
