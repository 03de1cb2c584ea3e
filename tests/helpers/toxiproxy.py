"""Toxiproxy (a fault-injecting TCP proxy) for the network-fault tests: its server, built by
scripts/toxiproxy.sh into the per-user cache, run on loopback, and driven through its HTTP API.

A stall is a `latency` toxic far longer than the stall on both directions: every byte sent while
it is in place is held, no connection is closed, and removing the toxic delivers what was held,
in order (Toxiproxy's latency toxic never drops data). That is a network that stops answering
for a while and then comes back, as a switch failover or a long GC pause on a router does."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.helpers import ROOT, free_port

SCRIPT = ROOT / "scripts" / "toxiproxy.sh"
HOLD_MS = 600_000  # the stall's latency: longer than any stall a test makes, so nothing leaks through
RELEASE_S = 60.0  # how long removing a stall may take on a loaded machine


def server_binary() -> Path:
    """The Toxiproxy server, built on first use; AssertionError saying why when it cannot be."""
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"Toxiproxy could not be built ({SCRIPT}): {done.stderr[-2000:]}"
    binary = Path(done.stdout.strip().splitlines()[-1])
    assert binary.is_file(), f"{SCRIPT} printed {binary}, which is not a file"
    return binary


class Toxiproxy:
    """One Toxiproxy server on 127.0.0.1 (its API on a free port); `stop()` ends it."""

    def __init__(self, log_file: Path):
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self._log = open(log_file, "ab")  # noqa: SIM115 - the server writes to it until stop()
        self.proc = subprocess.Popen(
            [str(server_binary()), "-host", "127.0.0.1", "-port", str(self.api_port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=5)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, f"the Toxiproxy server exited with {self.proc.returncode} ({log_file})"
            try:
                self.http.get("/version").raise_for_status()
                return
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"the Toxiproxy server did not answer at {self.url}"
                time.sleep(0.1)

    def proxy(self, name: str, listen_port: int, upstream_port: int) -> None:
        """Forward 127.0.0.1:listen_port to 127.0.0.1:upstream_port."""
        self.http.post(
            "/proxies",
            json={
                "name": name,
                "listen": f"127.0.0.1:{listen_port}",
                "upstream": f"127.0.0.1:{upstream_port}",
                "enabled": True,
            },
        ).raise_for_status()

    def stall(self, name: str) -> None:
        """Hold every byte through proxy `name`, both ways, until `release`; connections stay open."""
        for stream in ("upstream", "downstream"):
            self.http.post(
                f"/proxies/{name}/toxics",
                json={
                    "name": f"stall-{stream}",
                    "type": "latency",
                    "stream": stream,
                    "toxicity": 1.0,
                    "attributes": {"latency": HOLD_MS},
                },
            ).raise_for_status()

    def release(self, name: str) -> None:
        """End a stall: what was held is delivered, in order.

        Removing a latency toxic waits for Toxiproxy to hand on what the toxic holds, which took
        longer than 5 s on a loaded machine (a CI run's ReadTimeout): each removal gets a minute."""
        for stream in ("upstream", "downstream"):
            path = f"/proxies/{name}/toxics/stall-{stream}"
            try:
                self.http.delete(path, timeout=RELEASE_S).raise_for_status()
            except httpx.TimeoutException:
                raise AssertionError(f"Toxiproxy did not remove {path} in {RELEASE_S} s") from None

    def cut(self, name: str) -> None:
        """Close every connection through proxy `name` and refuse new ones, until `restore`."""
        self.http.post(f"/proxies/{name}", json={"enabled": False}).raise_for_status()

    def restore(self, name: str) -> None:
        self.http.post(f"/proxies/{name}", json={"enabled": True}).raise_for_status()

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
