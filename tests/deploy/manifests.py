"""deploy/kubernetes rendered the way `kubectl apply -k` would for what we use of kustomize: the listed
resources, the generated ConfigMap, the namespace on namespaced objects (no name-hash suffix: tests
refer to objects by their base names)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gateway.config.settings import load_settings
from gateway.fleet.alert_rules import RuleSet, build_rules
from tests.deploy.tools import REPO

KUBE_DIR = REPO / "deploy" / "kubernetes"
EXAMPLE_CONFIG = "deploy/kubernetes/gateway-config.yaml"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

Doc = dict[str, Any]


def kustomization() -> Doc:
    data: Doc = yaml.safe_load((KUBE_DIR / "kustomization.yaml").read_text())
    return data


def resource_documents() -> list[tuple[str, Doc]]:
    out = []
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((KUBE_DIR / name).read_text()):
            if doc:
                out.append((name, doc))
    return out


def generated_configmaps() -> list[Doc]:
    out = []
    for generator in kustomization().get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (KUBE_DIR / path).read_text()
        out.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return out


def rendered() -> list[Doc]:
    kust = kustomization()
    docs = [doc for _, doc in resource_documents()] + generated_configmaps()
    out = []
    for original in docs:
        doc = copy.deepcopy(original)
        if doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = kust["namespace"]
        out.append(doc)
    return out


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def gateway_config() -> Doc:
    text = find(generated_configmaps(), "ConfigMap", "llm-gateway-config")["data"]["config.yaml"]
    data: Doc = yaml.safe_load(text)
    return data


def example_rules() -> RuleSet:
    """The Prometheus rules `llm-gateway alerts` makes of the example config (no environment overrides)."""
    return build_rules(load_settings(REPO / EXAMPLE_CONFIG, environ={}))
