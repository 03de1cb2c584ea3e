"""Who may use the worker's HTTP API: the rules, with no I/O (worker/web/web_guard.py applies them to
each request, and kbroker/config.py reads the token).

- The server binds loopback unless told otherwise; bound anywhere else it needs a token, or it
  refuses to start (`bind_refusal`).
- Every request names an allowed host (`Host`): the bound address, the loopback names and the
  ones the operator lists. A web page that rebinds its own name to 127.0.0.1 still sends its own
  name, so it gets 421 and nothing else (DNS rebinding).
- A request that could change state (anything but GET, HEAD, OPTIONS) from a browser must come
  from a page of an allowed host (`Origin`, `Sec-Fetch-Site`): 403 otherwise.
- With a token, every request carries it: `Authorization: Bearer <token>` (the CLI, scripts) or
  the session cookie (a browser), which `GET <page>?token=<token>` sets once; 401 otherwise.
  The cookie holds a digest of the token, not the token, and is HttpOnly and SameSite=Strict.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "127.0.0.1", "::1"})
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
COOKIE = "kbroker_web_session"
TOKEN_PARAM = "token"
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether binding `host` reaches this machine only."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, token: str | None) -> str | None:
    """Why the server may not bind `host` (None: it may)."""
    if token or is_loopback(host):
        return None
    return (
        f"the worker's HTTP API binds {host or 'every interface'}, off loopback, without a token: "
        "set KBROKER_WEB_TOKEN or --web-token-file, or bind 127.0.0.1"
    )


def token_problem(token: str) -> str | None:
    """What is wrong with a token the operator gave (None: nothing)."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"the web token has {len(token)} characters; it needs at least {MIN_TOKEN_CHARS}"
    if any(c.isspace() or not c.isprintable() for c in token):
        return "the web token may hold no spaces or control characters"
    return None


def host_name(value: str | None) -> str | None:
    """The host of a Host header or a URL's netloc, lower case, without the port (None: none)."""
    if not value:
        return None
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:6066
        end = value.find("]")
        return value[1:end] if end > 0 else None
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".") or None


@dataclass(frozen=True)
class Access:
    """The rules of one server: the hosts it answers for and its token (None: no token)."""

    hosts: frozenset[str]
    token: str | None = None

    @classmethod
    def of(cls, bind: str, allowed: Iterable[str] = (), token: str | None = None) -> Access:
        hosts = set(LOOPBACK_NAMES)
        bound = host_name(bind)
        if bound and bound not in ANY_ADDRESS:
            hosts.add(bound)
        hosts.update(h for h in map(host_name, allowed) if h)
        return cls(frozenset(hosts), token or None)

    def host_allowed(self, host: str | None) -> bool:
        if host is None:
            return False
        return host in self.hosts or any(h.startswith(".") and host.endswith(h) for h in self.hosts)

    def origin_allowed(self, origin: str | None, fetch_site: str | None) -> bool:
        """Whether a state-changing request comes from a page the server may trust: no browser
        context at all (a CLI sends neither header), or a page of an allowed host."""
        if fetch_site is not None and fetch_site.lower() not in ("same-origin", "none"):
            return False
        if origin is None:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and self.host_allowed(host_name(parts.netloc))

    def session(self) -> str:
        """The session cookie's value: a digest of the token (a stolen cookie does not reveal it)."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"kbroker worker web session", hashlib.sha256).hexdigest()

    def token_ok(self, authorization: str | None, cookie: str | None) -> bool:
        if self.token is None:
            return True
        if authorization is not None:
            scheme, _, given = authorization.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
                return True
        return cookie is not None and hmac.compare_digest(cookie.encode(), self.session().encode())

    def login_ok(self, given: str | None) -> bool:
        """Whether `?token=` carries the token (the URL a browser opens once)."""
        return self.token is not None and given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(
        self,
        method: str,
        host: str | None,
        origin: str | None,
        fetch_site: str | None,
        authorization: str | None,
        cookie: str | None,
    ) -> tuple[int, str] | None:
        """(status, reason) to answer a request with instead of serving it, or None to serve it."""
        if not self.host_allowed(host_name(host)):
            return 421, f"this server does not answer for host {host!r} (a worker takes more with --web-allowed-host)"
        if method.upper() not in SAFE_METHODS and not self.origin_allowed(origin, fetch_site):
            return 403, f"a {method.upper()} from {origin or fetch_site!r} is refused"
        if not self.token_ok(authorization, cookie):
            return 401, (
                "the worker's HTTP API needs its token: Authorization: Bearer <token>, "
                f"or in a browser open the page once as <page>?{TOKEN_PARAM}=<token>"
            )
        return None
