"""Who may use a real worker's HTTP API (kbroker/worker/web/web_guard.py): a `kbroker worker`
subprocess on the session broker, bound to every interface with a token, as in the compose
stack. A foreign Host gets 421, a request without the token 401, with it 200; a state-changing
request from a foreign page 403; Faust's own pages 404; the CLI sends the token; the dashboard
works in a browser after opening its one-time URL; and off loopback without a token the worker
does not start."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from kbroker.core.security.web_access import COOKIE
from kbroker.kafka.catalog.apply import apply_paths
from tests.helpers import KBROKER, ROOT, free_port
from tests.integration.test_dashboard import (
    CATALOG,
    browser,  # noqa: F401 - the fixture: Debian's chromium
)
from tests.integration.test_worker import Worker

TOKEN = "test-web-token-" + uuid.uuid4().hex
BEARER = {"Authorization": f"Bearer {TOKEN}"}
PAGES = (
    "/tasks/",
    "/monitors/",
    "/conversations/",
    "/dialogs/",
    "/dashboard",
    "/dashboard/snapshot",
    "/dashboard/static/dashboard.js",
)
FAUST_PAGES = ("/", "/router/", "/table/", "/table/monitors/", "/graph/", "/stats/", "/assignment/", "/performance/")


@pytest.fixture(scope="module")
def web_worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    ns = "web" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [CATALOG])  # the namespace's system topics and a few queues
    w = Worker(
        kafka_bootstrap,
        ns,
        tmp_path_factory.mktemp("web"),
        "--web-host",
        "0.0.0.0",
        "--no-routing",
        "--no-timers",
        KBROKER_WEB_TOKEN=TOKEN,
    )
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def get(w: Worker, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(w.url + path, timeout=30, follow_redirects=False, **kw)


def test_every_page_needs_the_token(web_worker):
    for path in PAGES:
        assert get(web_worker, path).status_code == 401, path
        assert get(web_worker, path, headers={"Authorization": "Bearer wrong-token-of-some-length"}).status_code == 401
        assert get(web_worker, path, headers=BEARER).status_code == 200, path
    refused = get(web_worker, "/tasks/")
    assert refused.headers["WWW-Authenticate"] == "Bearer" and "token" in refused.json()["error"]
    assert TOKEN not in refused.text


def test_a_foreign_host_is_refused_even_with_the_token(web_worker):
    # What a page on evil.example sends after rebinding its name to 127.0.0.1.
    for host in ("evil.example", f"evil.example:{web_worker.port}", "127.0.0.1.nip.io"):
        for path in ("/tasks/", "/dashboard"):
            resp = get(web_worker, path, headers={**BEARER, "Host": host})
            assert resp.status_code == 421, (host, path, resp.status_code)
    for host in (f"localhost:{web_worker.port}", f"127.0.0.1:{web_worker.port}"):
        assert get(web_worker, "/tasks/", headers={**BEARER, "Host": host}).status_code == 200


def test_a_state_changing_request_from_a_foreign_page_is_refused(web_worker):
    url = web_worker.url + "/tasks/"
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
        assert httpx.post(url, headers={**BEARER, **headers}, timeout=30).status_code == 403, headers
    # Without a foreign origin it reaches the page, which takes no POST.
    assert httpx.post(url, headers=BEARER, timeout=30).status_code == 405


def test_faust_own_pages_are_not_served(web_worker):
    for path in FAUST_PAGES:
        assert get(web_worker, path, headers=BEARER).status_code == 404, path


def test_the_cli_sends_the_token(web_worker):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KBROKER_WEB_TOKEN", None)
    env.pop("KBROKER_WEB_TOKEN_FILE", None)
    cmd = [KBROKER, "tasks", "--url", web_worker.url, "--json"]
    without = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert without.returncode == 1 and "401" in without.stderr, without.stderr
    ok = subprocess.run(cmd, env={**env, "KBROKER_WEB_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and orjson.loads(ok.stdout) == [], ok.stderr


def test_the_dashboard_works_in_a_browser_after_its_one_time_url(web_worker, browser):
    # The URL with the token answers with the session cookie and a redirect that drops the token.
    login = get(web_worker, f"/dashboard?token={TOKEN}")
    assert login.status_code == 303 and login.headers["Location"] == "/dashboard"
    cookie = login.cookies[COOKIE]
    assert TOKEN not in cookie and "httponly" in login.headers["set-cookie"].lower()
    assert "samesite=strict" in login.headers["set-cookie"].lower()
    assert get(web_worker, "/dashboard/snapshot", cookies={COOKIE: cookie}).status_code == 200
    assert get(web_worker, f"/dashboard?token=wrong-{TOKEN}").status_code == 401
    # Never a redirect to another site.
    assert get(web_worker, f"//evil.example/x?token={TOKEN}").headers["Location"] == "/evil.example/x"

    page = browser.new_page()
    try:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(web_worker.url + "/dashboard", wait_until="load")
        assert "needs its token" in page.content()  # before the one-time URL
        page.goto(f"{web_worker.url}/dashboard?token={TOKEN}", wait_until="load")
        assert page.url == web_worker.url + "/dashboard"
        # Its script, style sheets and stream all pass with the cookie: snapshots arrive.
        page.wait_for_function("() => window.kbrokerDashboard && window.kbrokerDashboard.snapshots > 1", timeout=30_000)
        assert errors == [], errors
    finally:
        page.close()


def test_off_loopback_without_a_token_the_worker_does_not_start(kafka_bootstrap, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBROKER_WEB_TOKEN")}
    run = subprocess.run(
        [
            KBROKER,
            "worker",
            "--bootstrap",
            kafka_bootstrap,
            "--namespace",
            "web" + uuid.uuid4().hex[:8],
            "--web-host",
            "0.0.0.0",
            "--web-port",
            str(free_port()),
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kbroker: error:") and "KBROKER_WEB_TOKEN" in lines[0], run.stderr
    # A token too short to be a secret is refused the same way.
    run = subprocess.run(
        [KBROKER, "worker", "--bootstrap", kafka_bootstrap, "--web-host", "0.0.0.0", "--web-port", str(free_port())],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "KBROKER_WEB_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "at least 16" in run.stderr, run.stderr
