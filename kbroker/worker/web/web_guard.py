"""The gate in front of every page of the worker's HTTP API (core/security/web_access.py has the rules):
an aiohttp middleware that answers 421 for a foreign Host, 403 for a state-changing request from
a foreign page, 401 without the token; and `GET <page>?token=<token>`, the URL a browser opens
once, which sets the session cookie and redirects to the page without the token in its address.

Also here: Faust's own pages (/router, /table, /graph, the statistics, /performance and the
"/" index) are not served. They show the worker's tables and assignment, and nobody needs them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from kbroker.core.security.web_access import COOKIE, TOKEN_PARAM, Access, bind_refusal, token_problem
from kbroker.errors import InvalidArgumentError
from kbroker.worker.settings import WorkerSettings

log = logging.getLogger("kbroker.worker.web")

# Faust's settings that turn its own pages off (the "/" index has none: web_pages_off drops it).
FAUST_PAGES_OFF = {
    "web_router_enabled": False,
    "web_tables_enabled": False,
    "web_graph_enabled": False,
    "web_stats_enabled": False,
    "web_metrics_enabled": False,
}
FAUST_PAGES = "faust.web.apps."

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def access_of(s: WorkerSettings) -> Access:
    """The rules of `s`'s server; InvalidArgumentError (one line) for a token too weak, or a bind
    off loopback without one: the worker does not start."""
    if s.web_token is not None and (problem := token_problem(s.web_token)):
        raise InvalidArgumentError(problem)
    if refusal := bind_refusal(s.web_host, s.web_token):
        raise InvalidArgumentError(refusal)
    return Access.of(s.web_host, s.web_allowed_hosts, s.web_token)


def gate(access: Access) -> Any:
    """The middleware applying `access` to every request, Faust's and kbroker's pages alike."""

    @web.middleware
    async def web_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        h = request.headers
        refused = access.refusal(
            request.method,
            h.get("Host"),
            h.get("Origin"),
            h.get("Sec-Fetch-Site"),
            h.get("Authorization"),
            request.cookies.get(COOKIE),
        )
        if refused is not None and refused[0] == 401 and access.login_ok(request.query.get(TOKEN_PARAM)):
            return login(request, access)
        if refused is not None:
            status, reason = refused
            log.info("HTTP %s %s refused (%d): %s", request.method, request.path, status, reason)
            return web.json_response(
                {"error": reason}, status=status, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None
            )
        return await handler(request)

    return web_gate


def login(request: web.Request, access: Access) -> web.StreamResponse:
    """The one-time URL: the session cookie (HttpOnly, SameSite=Strict: no script reads it, no
    other site's request carries it), and a redirect to the same page without the token."""
    query = {k: v for k, v in request.query.items() if k != TOKEN_PARAM}
    # One leading slash: "//other.example/..." would send the browser to another site.
    here = request.rel_url.with_path("/" + request.path.lstrip("/")).with_query(query)
    resp = web.Response(status=303, headers={"Location": str(here)})
    resp.set_cookie(COOKIE, access.session(), httponly=True, samesite="Strict", path="/")
    resp.headers["Referrer-Policy"] = "no-referrer"
    return resp


def web_options(s: WorkerSettings) -> dict[str, Any]:
    """The Faust app's settings for its web server: bound where `s` says, behind the gate, and
    none of Faust's own pages."""
    return {
        "web_port": s.web_port,
        "web_bind": s.web_host,
        "web_host": s.web_host,
        "web_application_options": {"middlewares": [gate(access_of(s))]},
        **FAUST_PAGES_OFF,
    }


def web_pages_off(app: Any) -> None:
    """Drop what Faust would still serve of its own (its "/" index has no setting)."""
    blueprints = app.web.blueprints
    blueprints._enabled[:] = [
        (prefix, bp) for prefix, bp in blueprints._enabled if not (isinstance(bp, str) and bp.startswith(FAUST_PAGES))
    ]
