"""An SDK or transport process's kbroker metrics for Prometheus (kbroker/metrics.py names them):
opt-in, since an application may already serve a registry of its own, in which case kbroker's
families are in prometheus_client's default registry and its exporter serves them too.

    server = MetricsServer(9464)      # http://127.0.0.1:9464/metrics until server.close()
"""

from __future__ import annotations

from typing import Self

from prometheus_client import start_http_server


class MetricsServer:
    """This process's metrics at http://host:port/metrics, served on a thread of its own (port 0:
    any free port; `port` says which)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1"):
        self._server, self._thread = start_http_server(port, addr=host)
        self.host, self.port = host, int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving (the metrics themselves go on counting)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
