"""Asking a worker's HTTP API from kbroker's own code (the CLI's views, the demo, the benchmark):
each request carries the token the environment gives (config.web_token), which the worker
requires when it has one. The standard library's client: no HTTP package in the base install."""

from __future__ import annotations

import os
from typing import Any

import orjson

from kbroker.config import web_token


def get(
    url: str,
    path: str = "",
    timeout: float = 5.0,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
) -> bytes:
    """The body of GET `url` + `path` with the token (`token`, else config.web_token(token_file));
    OSError when it fails (refused, timed out, an HTTP error status: urllib's errors are OSErrors)."""
    import urllib.request  # here, not at the top: `kbroker --help` starts faster without it

    token = token or web_token(token_file)
    request = urllib.request.Request(
        url.rstrip("/") + path if path else url, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body


def get_json(
    url: str,
    path: str = "",
    timeout: float = 5.0,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
) -> Any:
    """get(), parsed; ValueError for a body that is not JSON."""
    return orjson.loads(get(url, path, timeout, token, token_file))
