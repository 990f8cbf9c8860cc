"""deploy/kubernetes: schema-valid (kubernetes-validate, strict: unknown fields are errors) for the
oldest Kubernetes we support and the newest the validator knows, the ServiceMonitor against our
schema subset, and the promises that span objects (names, labels, ports, drain timing, security)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.config.discovery_settings import ReplicaSources
from gateway.config.settings import PoolSettings, parse_settings
from tests.deploy.manifests import (
    KUBE_DIR,
    Doc,
    find,
    gateway_config,
    generated_configmaps,
    kustomization,
    rendered,
    resource_documents,
)
from tests.deploy.tools import require_module

MIN_KUBERNETES = "1.26.0"
"""EndpointSlice `conditions.terminating` is GA from 1.26; older clusters cannot drain by it."""
SERVICE_MONITOR_SCHEMA = Path(__file__).parent / "schemas" / "servicemonitor-monitoring.coreos.com-v1.json"
UVICORN_SHUTDOWN_SLACK_S = 5  # gateway/uvicorn_runner.py: timeout_graceful_shutdown = drain_timeout_s + 5


def _core_docs() -> list[Doc]:
    return [d for d in rendered() if not d["apiVersion"].startswith("monitoring.coreos.com/")]


def _pod_spec(name: str) -> Doc:
    spec: Doc = find(rendered(), "Deployment", name)["spec"]["template"]["spec"]
    return spec


def _container(name: str) -> Doc:
    container: Doc = _pod_spec(name)["containers"][0]
    return container


def test_kustomization_lists_every_manifest() -> None:
    listed = set(kustomization()["resources"])
    generated = {e.rpartition("=")[2] for g in kustomization()["configMapGenerator"] for e in g["files"]}
    on_disk = {p.name for p in KUBE_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed | generated == on_disk
    assert len(resource_documents()) >= 12


@pytest.mark.parametrize("version", [MIN_KUBERNETES, "latest"])
def test_manifests_match_the_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = require_module("kubernetes_validate", "kubernetes-validate")
    target = kubernetes_validate.latest_version() if version == "latest" else version
    problems = []
    for doc in _core_docs():
        try:
            kubernetes_validate.validate(doc, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert not problems, "\n".join(problems)


def test_validator_rejects_a_typo() -> None:
    kubernetes_validate = require_module("kubernetes_validate", "kubernetes-validate")
    broken = copy.deepcopy(find(rendered(), "Deployment", "llm-gateway"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, MIN_KUBERNETES, strict=True)


def test_service_monitor_matches_its_schema() -> None:
    jsonschema = require_module("jsonschema", "kubernetes-validate")
    schema = json.loads(SERVICE_MONITOR_SCHEMA.read_text())
    monitor = find(rendered(), "ServiceMonitor", "llm-gateway")
    jsonschema.Draft202012Validator(schema).validate(monitor)
    typo = copy.deepcopy(monitor)
    typo["spec"]["endpoints"][0]["intervall"] = "15s"
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(typo))
    service = find(rendered(), "Service", "llm-gateway")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_gateway_config_is_a_valid_config() -> None:
    raw = gateway_config()
    for pool in raw["pools"]:
        ReplicaSources.model_validate(pool["replicas"])
    without_discovery = copy.deepcopy(raw)
    for pool in without_discovery["pools"]:
        pool["replicas"] = {"static": []}
    parse_settings(without_discovery)  # the rest of the file, with today's settings models
    replicas_model = PoolSettings.model_fields["replicas"].annotation
    if "kubernetes" in getattr(replicas_model, "model_fields", {}):
        parse_settings(raw)  # once gateway/config/settings.py uses ReplicaSources: the whole file


def test_gateway_deployment_is_highly_available_and_locked_down() -> None:
    deployment = find(rendered(), "Deployment", "llm-gateway")
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod, container = _pod_spec("llm-gateway"), _container("llm-gateway")
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert container["image"] in {i["name"] for i in kustomization()["images"]}
    env = {e["name"]: e for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert env["LLM_GATEWAY_CONFIG"]["value"] == f"{mount['mountPath']}/config.yaml"
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] in {c["metadata"]["name"] for c in generated_configmaps()}
    assert gateway_config()["server"]["port"] == container["ports"][0]["containerPort"]


def test_termination_grace_covers_prestop_and_drain() -> None:
    pod, container = _pod_spec("llm-gateway"), _container("llm-gateway")
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = int(command[1])
    drain_s = gateway_config()["server"]["drain_timeout_s"]
    budget_s = pre_stop_s + drain_s + UVICORN_SHUTDOWN_SLACK_S
    assert pod["terminationGracePeriodSeconds"] > budget_s, (
        f"terminationGracePeriodSeconds must exceed preStop {pre_stop_s} + drain {drain_s} + "
        f"{UVICORN_SHUTDOWN_SLACK_S} s, or Kubernetes kills streams that are still draining"
    )


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_selectors_ports_and_names_line_up() -> None:
    docs = rendered()
    pod_labels = find(docs, "Deployment", "llm-gateway")["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        obj = find(docs, kind, "llm-gateway")
        selector = obj["spec"]["selector"]
        assert _matches(selector.get("matchLabels", selector), pod_labels), kind
    service = find(docs, "Service", "llm-gateway")
    port_names = {p["name"] for p in _container("llm-gateway")["ports"]}
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])
    assert (
        _pod_spec("llm-gateway")["serviceAccountName"]
        == find(docs, "ServiceAccount", "llm-gateway")["metadata"]["name"]
    )


def test_discovery_rbac_and_upstream_service() -> None:
    docs = rendered()
    role = find(docs, "Role", "llm-gateway-discovery")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
    ]
    binding = find(docs, "RoleBinding", "llm-gateway-discovery")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    subject = binding["subjects"][0]
    assert subject == {
        "kind": "ServiceAccount",
        "name": "llm-gateway",
        "namespace": kustomization()["namespace"],
    }

    kube: dict[str, Any] = gateway_config()["pools"][0]["replicas"]["kubernetes"]
    upstream = find(docs, "Service", kube["service"])
    assert upstream["spec"]["clusterIP"] == "None"  # headless: one endpoint per pod
    assert kube["port"] in {p["name"] for p in upstream["spec"]["ports"]}
    engine = find(docs, "Deployment", kube["service"])
    assert _matches(upstream["spec"]["selector"], engine["spec"]["template"]["metadata"]["labels"])
    assert "preStop" in engine["spec"]["template"]["spec"]["containers"][0]["lifecycle"]


def test_redis_matches_the_state_url() -> None:
    url = gateway_config()["state"]["url"]
    match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", url)
    assert match, url
    service = find(rendered(), "Service", match.group(1))
    assert int(match.group(2)) in {p["port"] for p in service["spec"]["ports"]}
    assert find(rendered(), "Deployment", "redis")["spec"]["replicas"] == 1
