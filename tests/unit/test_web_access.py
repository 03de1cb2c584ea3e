"""The rules of the worker's HTTP API (kbroker/core/security/web_access.py) and where its token comes
from (kbroker/config.py), without a server: the Host, Origin and token decisions request by request."""

from __future__ import annotations

import pytest

from kbroker.config import web_token
from kbroker.core.security.web_access import Access, bind_refusal, host_name, is_loopback, token_problem

TOKEN = "s3cret-token-of-32-characters-xx"


@pytest.mark.parametrize(
    "host,loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("worker.example.com", False),
    ],
)
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback
    assert (bind_refusal(host, None) is None) is loopback
    assert bind_refusal(host, TOKEN) is None


def test_the_refusal_to_bind_is_one_line_naming_the_remedy():
    why = bind_refusal("0.0.0.0", None)
    assert why is not None and "\n" not in why and "KBROKER_WEB_TOKEN" in why and "0.0.0.0" in why


@pytest.mark.parametrize(
    "header,name",
    [
        ("127.0.0.1:6066", "127.0.0.1"),
        ("LocalHost:80", "localhost"),
        ("[::1]:6066", "::1"),
        ("evil.example:6066", "evil.example"),
        ("worker.", "worker"),
        ("", None),
        (None, None),
    ],
)
def test_host_name(header, name):
    assert host_name(header) == name


def test_host_check_answers_for_the_bound_address_the_loopback_names_and_the_listed_ones():
    access = Access.of("10.1.2.3", ["dash.example.com", ".internal"])
    for host in (
        "127.0.0.1:6066",
        "localhost:6066",
        "[::1]:6066",
        "10.1.2.3:6066",
        "dash.example.com",
        "w1.internal:6066",
    ):
        assert access.refusal("GET", host, None, None, None, None) is None, host
    for host in ("evil.example:6066", "10.1.2.4:6066", "dash.example.com.evil", "internal", None, ""):
        refused = access.refusal("GET", host, None, None, None, None)
        assert refused is not None and refused[0] == 421, host
    # Bound to every interface: the wildcard address names no host.
    assert Access.of("0.0.0.0").refusal("GET", "0.0.0.0:6066", None, None, None, None)[0] == 421


def test_state_changing_requests_from_a_foreign_page_are_refused():
    access = Access.of("127.0.0.1")
    assert access.refusal("GET", "localhost", "http://evil.example", "cross-site", None, None) is None
    for origin, site in (
        ("http://evil.example", None),
        ("null", None),
        (None, "cross-site"),
        (None, "same-site"),
        ("file://x", None),
    ):
        refused = access.refusal("POST", "localhost:6066", origin, site, None, None)
        assert refused is not None and refused[0] == 403, (origin, site)
    for origin, site in ((None, None), ("http://localhost:6066", "same-origin"), ("http://127.0.0.1:6066", None)):
        assert access.refusal("POST", "localhost:6066", origin, site, None, None) is None, (origin, site)


def test_with_a_token_every_request_carries_it():
    access = Access.of("0.0.0.0", token=TOKEN)
    assert access.refusal("GET", "localhost", None, None, None, None)[0] == 401
    assert access.refusal("GET", "localhost", None, None, "Bearer wrong", None)[0] == 401
    assert access.refusal("GET", "localhost", None, None, f"Basic {TOKEN}", None)[0] == 401
    assert access.refusal("GET", "localhost", None, None, TOKEN, None)[0] == 401
    assert access.refusal("GET", "localhost", None, None, f"Bearer {TOKEN}", None) is None
    assert access.refusal("GET", "localhost", None, None, f"bearer {TOKEN}", None) is None
    # The cookie holds a digest of the token, not the token.
    assert access.session() != TOKEN and TOKEN not in access.session()
    assert access.refusal("GET", "localhost", None, None, None, access.session()) is None
    assert access.refusal("GET", "localhost", None, None, None, TOKEN)[0] == 401
    assert access.login_ok(TOKEN) and not access.login_ok("x" * 32) and not access.login_ok(None)
    # The Host check comes first: the token does not open a foreign host's request.
    assert access.refusal("GET", "evil.example", None, None, f"Bearer {TOKEN}", None)[0] == 421
    assert not Access.of("127.0.0.1").login_ok(TOKEN)


def test_token_problems():
    assert token_problem(TOKEN) is None
    assert "16" in (token_problem("short") or "")
    assert token_problem("has a space in it, 32 chars long") is not None


def test_the_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("KBROKER_WEB_TOKEN", raising=False)
    monkeypatch.delenv("KBROKER_WEB_TOKEN_FILE", raising=False)
    assert web_token() is None
    monkeypatch.setenv("KBROKER_WEB_TOKEN", f" {TOKEN}\n")
    assert web_token() == TOKEN
    secret = tmp_path / "token"
    secret.write_text(f"\n{TOKEN}-file\nsecond line\n")
    monkeypatch.setenv("KBROKER_WEB_TOKEN_FILE", str(secret))
    assert web_token() == f"{TOKEN}-file"  # the file wins over the variable
    assert web_token(secret) == f"{TOKEN}-file"
    secret.write_text("\n \n")
    with pytest.raises(ValueError, match="empty"):
        web_token()
    with pytest.raises(ValueError, match="cannot read"):
        web_token(tmp_path / "missing")
