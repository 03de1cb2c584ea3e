"""The worker's Faust app as build_app configures it, without a broker (faust.App connects
nothing until it runs): its web server closed by default, Faust's own pages off, and its aiokafka
clients sized for any record a kbroker topic takes."""

from __future__ import annotations

import pytest

from kbroker.core import names
from kbroker.core.topic_limits import CLIENT_LIMIT, DEAD_LETTER_LIMIT, RECORD_OVERHEAD
from kbroker.errors import InvalidArgumentError
from kbroker.kafka import clients
from kbroker.worker.app import new_app
from kbroker.worker.settings import WorkerSettings
from kbroker.worker.web.web_guard import FAUST_PAGES, access_of, web_pages_off

TOKEN = "a-token-of-more-than-16-chars"


def test_every_client_takes_the_largest_record_of_any_topic(tmp_path):
    batch = 61  # a record batch's own header
    assert CLIENT_LIMIT >= DEAD_LETTER_LIMIT + RECORD_OVERHEAD + batch
    assert clients.MAX_MESSAGE_BYTES == CLIENT_LIMIT
    conf = new_app(WorkerSettings("127.0.0.1:1", "ns"), str(tmp_path), names.MONITOR_PARTITIONS).conf
    assert conf.producer_max_request_size == CLIENT_LIMIT and conf.consumer_max_fetch_size == CLIENT_LIMIT
    # Kafka's default max.message.bytes (1 MiB + 12), which the worker's own topics keep, fits.
    assert conf.consumer_max_fetch_size >= 1_048_588


def test_the_web_server_binds_loopback_and_serves_none_of_faust_own_pages(tmp_path):
    s = WorkerSettings("127.0.0.1:1", "ns")
    app = new_app(s, str(tmp_path), names.MONITOR_PARTITIONS)
    assert app.conf.web_bind == "127.0.0.1" and app.conf.web_port == 6066
    assert not any(
        getattr(app.conf, f)
        for f in (
            "web_router_enabled",
            "web_tables_enabled",
            "web_graph_enabled",
            "web_stats_enabled",
            "web_metrics_enabled",
        )
    )
    assert any(isinstance(bp, str) and bp.startswith(FAUST_PAGES) for _, bp in app.web.blueprints._enabled)
    web_pages_off(app)  # Faust's "/" index has no setting of its own
    assert app.web.blueprints._enabled == []
    assert len(app.conf.web_application_options["middlewares"]) == 1


def test_off_loopback_needs_a_token_of_16_characters_or_more():
    with pytest.raises(InvalidArgumentError, match="KBROKER_WEB_TOKEN"):
        access_of(WorkerSettings("127.0.0.1:1", "ns", web_host="0.0.0.0"))
    with pytest.raises(InvalidArgumentError, match="at least 16"):
        access_of(WorkerSettings("127.0.0.1:1", "ns", web_host="0.0.0.0", web_token="short"))
    access = access_of(
        WorkerSettings(
            "127.0.0.1:1", "ns", web_host="0.0.0.0", web_token=TOKEN, web_allowed_hosts=("dash.example.com",)
        )
    )
    assert access.token == TOKEN and "dash.example.com" in access.hosts and "0.0.0.0" not in access.hosts
    assert access_of(WorkerSettings("127.0.0.1:1", "ns")).token is None
