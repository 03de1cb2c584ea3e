"""bench/usage.py: each side's CPU time and its own peak RSS, not the process's lifetime peak."""

from __future__ import annotations

import time

from kbroker.bench.usage import usage


def test_each_block_gets_its_own_peak_rss_and_cpu_time():
    big: dict = {}
    with usage(big):
        block = bytearray(120 * 1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
        del block
    small: dict = {}
    with usage(small):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.05:
            pass
    assert big["peak_rss_mb"] - small["peak_rss_mb"] > 100 or small["peak_rss_scope"] == "process"
    assert big["peak_rss_scope"] == small["peak_rss_scope"]
    assert small["cpu_seconds"] >= 0.04
