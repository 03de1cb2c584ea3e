"""The Kubernetes manifests (deploy/kubernetes/) without a cluster: every object against
Kubernetes's own schemas (kubernetes-validate, strict: an unknown field fails), and against
kbroker itself: each command line parses with the CLI it runs, the environment names the CLI
reads, the probes, the Prometheus annotations and the ports agree, every Secret, volume claim and
Deployment named is defined, and KEDA's trigger reads the very topic and consumer group of the
queue (core/names.py) that the reader it scales RECEIVEs from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from kbroker.core import names
from kbroker.core.catalog.loader import SAMPLES, load_definitions
from tests.helpers import ROOT
from tests.helpers.cli_lines import parse

HERE = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.33"  # a release every managed Kubernetes still offers; the schemas ship with the package


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(f, d) for f in sorted(HERE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def objects(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def containers() -> list[dict[str, Any]]:
    return [c for d in objects("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]


KUSTOMIZATION = yaml.safe_load((HERE / "kustomization.yaml").read_text())
CUSTOM_KINDS = {"Kustomization", "ScaledObject"}  # kustomize's file and KEDA's resource: no Kubernetes schema


@pytest.mark.parametrize(
    "doc",
    [d for _, d in documents() if d["kind"] not in CUSTOM_KINDS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_each_object_is_valid_for_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_schema_check_fails_on_a_broken_object() -> None:
    """The check above can fail: a typo in a field and a port that is not a number are refused."""
    worker = copy.deepcopy(objects("Deployment")[0])
    worker["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES, strict=True)
    worker = copy.deepcopy(objects("Deployment")[0])
    worker["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES, strict=True)


def test_the_kustomization_lists_every_file_and_names_the_image_the_containers_use() -> None:
    files = {f.name for f in HERE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(KUSTOMIZATION["resources"]) == sorted(files)
    assert {c["image"] for c in containers()} == {i["name"] for i in KUSTOMIZATION["images"]}


def parsed(argv: list[str], env: dict[str, Any] | None = None) -> click.Context:
    """The kbroker command line `argv`, parsed by the CLI itself in the container's environment
    (`env`: its plain values); the command's context."""
    assert argv[0] == "kbroker"
    plain = {k: v for k, v in (env or {}).items() if isinstance(v, str)}
    return parse(argv, plain)[-1]


def test_every_kbroker_command_line_parses_with_the_cli_it_runs() -> None:
    lines = []
    for c in containers():
        lines.append((c["command"], env_of(c)))
        for probe in ("readinessProbe", "livenessProbe"):
            if "exec" in c.get(probe, {}):
                lines.append((c[probe]["exec"]["command"], env_of(c)))
    kbroker_lines = [(argv, env) for argv, env in lines if argv[0] == "kbroker"]
    assert len(kbroker_lines) >= 4  # the worker, its two probes, the analytics job
    for argv, env in kbroker_lines:
        parsed(argv, env)
    with pytest.raises(click.UsageError):
        parsed(["kbroker", "worker", "--web-prot", "6066"])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_each_container_reaches_its_namespace_and_the_worker_its_token_and_port() -> None:
    for c in containers():
        env = env_of(c)
        assert env["KBROKER_NAMESPACE"] == "expenses" and env["KBROKER_BOOTSTRAP"]
    deployments = {d["metadata"]["name"]: d for d in objects("Deployment")}
    worker = deployments["kbroker-worker-expenses"]
    pod = worker["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    env = env_of(c)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    token_file = Path(env["KBROKER_WEB_TOKEN_FILE"])
    assert mounts["web-token"] == str(token_file.parent)
    secret = volumes["web-token"]["secret"]["secretName"]
    assert secret in {s["metadata"]["name"] for s in objects("Secret")}
    (stored,) = [s for s in objects("Secret") if s["metadata"]["name"] == secret]
    assert token_file.name in stored["stringData"]
    assert len(stored["stringData"][token_file.name]) >= 16  # the worker refuses a shorter token
    port = parsed(c["command"], env).params["web_port"]
    assert int(env["KBROKER_WEB_PORT"]) == port == c["ports"][0]["containerPort"]  # the probes ask that port
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert "$(POD_IP)" in env["KBROKER_WEB_ALLOWED_HOSTS"]  # Prometheus scrapes the pod's address
    service = objects("Service")[0]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["metadata"]["name"] in env["KBROKER_WEB_ALLOWED_HOSTS"]


def test_the_analytics_job_keeps_its_checkpoint_on_its_claim_and_serves_its_metrics() -> None:
    (job,) = [d for d in objects("Deployment") if d["metadata"]["name"] == "kbroker-analytics-expenses"]
    assert job["spec"]["replicas"] == 1 and job["spec"]["strategy"]["type"] == "Recreate"  # one checkpoint writer
    pod = job["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    params = parsed(c["command"], env_of(c)).params
    (mount,) = c["volumeMounts"]
    data = Path(mount["mountPath"])
    assert data in Path(params["checkpoint"]).parents and data in Path(params["history"]).parents
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] in {
        p["metadata"]["name"] for p in objects("PersistentVolumeClaim")
    }
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(params["metrics_port"])
    assert env_of(c)["KBROKER_METRICS_HOST"] == "0.0.0.0"  # served off loopback, where Prometheus scrapes


def test_keda_scales_the_reader_on_the_lag_of_the_queue_it_receives_from() -> None:
    (scaled,) = objects("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    deployments = {d["metadata"]["name"]: d for d in objects("Deployment")}
    reader = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
    (c,) = reader["spec"]["template"]["spec"]["containers"]
    env = env_of(c)
    script = c["command"][-1]
    assert script.startswith("/app/") and (ROOT / script.removeprefix("/app/")).is_file()
    (trigger,) = scaled["spec"]["triggers"]
    ns, queue = env["KBROKER_NAMESPACE"], env["KBROKER_QUEUE"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["topic"] == names.queue_topic(ns, queue)
    assert trigger["metadata"]["consumerGroup"] == names.queue_group(ns, queue)
    assert trigger["metadata"]["bootstrapServers"] == env["KBROKER_BOOTSTRAP"]
    catalog = load_definitions([SAMPLES], ns)
    assert queue in catalog.queues
    assert scaled["spec"]["minReplicaCount"] == 0 and reader["spec"]["replicas"] == 0  # none while it is empty
    assert scaled["spec"]["maxReplicaCount"] == catalog.queue(queue).activation.max_queue_readers
