"""Routes through a real broker: `kbroker apply` stamps created_at once per definition, and
`kbroker routes --json` lists them with AutoCreatedLocal."""

from __future__ import annotations

import os
import subprocess

import orjson

from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog
from tests.helpers import KBROKER

ROUTES = """
routes:
  - {name: Orders, service_name: //Remote/Orders, address: "kafka://h:9092/sales", lifetime: %d}
  - {name: Everything, address: LOCAL}
"""


def test_apply_stamps_routes_and_kbroker_routes_lists_them(kafka_bootstrap, namespace, tmp_path):
    f = tmp_path / "routes.yaml"
    f.write_text(ROUTES % 3600)
    assert apply_paths(kafka_bootstrap, namespace, [f]).objects_published == 2
    first = read_catalog(kafka_bootstrap, namespace).routes
    assert all(r.created_at is not None for r in first.values())

    assert apply_paths(kafka_bootstrap, namespace, [f]).objects_published == 0  # same definitions
    f.write_text(ROUTES % 7200)  # ALTER ROUTE ... LIFETIME: its lifetime starts again
    assert apply_paths(kafka_bootstrap, namespace, [f]).objects_published == 1
    now = read_catalog(kafka_bootstrap, namespace).routes
    assert now["Everything"].created_at == first["Everything"].created_at
    assert now["Orders"].created_at > first["Orders"].created_at

    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap, "KBROKER_NAMESPACE": namespace}
    out = subprocess.run([KBROKER, "routes", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in orjson.loads(out.stdout)}
    assert set(rows) == {"AutoCreatedLocal", "Everything", "Orders"}
    assert rows["Orders"]["lifetime"] == 7200 and rows["Orders"]["expired"] is False
    assert rows["Orders"]["expires_at"] is not None and rows["Everything"]["expires_at"] is None
