from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.discovery_settings import KubernetesReplicas
from gateway.upstream.discovery.k8s_auth import (
    KubeConfigError,
    in_cluster_access,
    kubeconfig_access,
    namespace_for,
    resolve_access,
)


def _settings(tmp_path: Path, tls_dir: Path, **extra: object) -> KubernetesReplicas:
    return KubernetesReplicas.model_validate(
        {
            "service": "vllm",
            "token_path": str(tmp_path / "token"),
            "ca_path": str(tls_dir / "ca.crt"),
            "namespace_path": str(tmp_path / "namespace"),
            **extra,
        }
    )


def _kubeconfig(
    tmp_path: Path, tls_dir: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [
            {"name": "dev", "context": {"cluster": "c1", "user": "u1", "namespace": "ml"}},
            {"name": "other", "context": {"cluster": "c1"}},
        ],
        "clusters": [
            {
                "name": "c1",
                "cluster": cluster
                or {"server": "https://127.0.0.1:6443/", "certificate-authority": str(tls_dir / "ca.crt")},
            }
        ],
        "users": [{"name": "u1", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_in_cluster_reads_env_ca_namespace_and_token_each_time(tmp_path: Path, tls_dir: Path) -> None:
    (tmp_path / "namespace").write_text("ml\n")
    settings = _settings(tmp_path, tls_dir)
    access = in_cluster_access(
        settings, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    )
    assert access.base_url == "https://[fd00::1]:6443"
    assert isinstance(access.verify, ssl.SSLContext) and access.namespace == "ml"
    assert access.headers() == {}  # no token file yet
    (tmp_path / "token").write_text("t1")
    assert access.headers() == {"Authorization": "Bearer t1"}
    (tmp_path / "token").write_text("t2")
    assert access.headers() == {"Authorization": "Bearer t2"}
    assert namespace_for(settings, access) == "ml"
    assert namespace_for(_settings(tmp_path, tls_dir, namespace="other"), access) == "other"


def test_in_cluster_errors(tmp_path: Path, tls_dir: Path) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_access(_settings(tmp_path, tls_dir), {})
    bad_ca = _settings(tmp_path, tls_dir, ca_path=str(tmp_path / "missing.crt"))
    with pytest.raises(KubeConfigError, match="CA"):
        in_cluster_access(bad_ca, {"KUBERNETES_SERVICE_HOST": "127.0.0.1"})


def test_kubeconfig_token_and_ca_file(tmp_path: Path, tls_dir: Path) -> None:
    access = kubeconfig_access(str(_kubeconfig(tmp_path, tls_dir, {"token": "abc"})))
    assert access.base_url == "https://127.0.0.1:6443"
    assert access.headers() == {"Authorization": "Bearer abc"} and access.namespace == "ml"
    assert isinstance(access.verify, ssl.SSLContext)
    assert access.verify.verify_mode is ssl.CERT_REQUIRED


def test_kubeconfig_client_cert_data_and_token_file(tmp_path: Path, tls_dir: Path) -> None:
    def b64(name: str) -> str:
        return base64.b64encode((tls_dir / name).read_bytes()).decode()

    (tmp_path / "tok").write_text("from-file\n")
    user = {
        "client-certificate-data": b64("server.crt"),
        "client-key-data": b64("server.key"),
        "tokenFile": "tok",
    }
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority-data": b64("ca.crt")}
    access = kubeconfig_access(str(_kubeconfig(tmp_path, tls_dir, user, cluster)))
    assert access.headers() == {"Authorization": "Bearer from-file"}  # relative to the kubeconfig
    assert isinstance(access.verify, ssl.SSLContext)


def test_kubeconfig_insecure_http_and_context_choice(tmp_path: Path, tls_dir: Path) -> None:
    path = _kubeconfig(
        tmp_path, tls_dir, {}, {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}
    )
    access = kubeconfig_access(str(path))
    assert isinstance(access.verify, ssl.SSLContext) and access.verify.verify_mode is ssl.CERT_NONE
    other = kubeconfig_access(str(path), "other")
    assert other.namespace is None and other.headers() == {}
    plain = kubeconfig_access(str(_kubeconfig(tmp_path, tls_dir, {}, {"server": "http://127.0.0.1:8001"})))
    assert plain.verify is False


KubeconfigCase = tuple[dict[str, Any], dict[str, Any] | None, str | None, str]


@pytest.mark.parametrize(
    "case",
    [
        ({"exec": {"command": "aws"}}, None, None, "kubectl proxy"),
        ({}, {"server": ""}, None, "no server URL"),
        ({}, None, "missing", "no context named 'missing'"),
        ({}, {"server": "https://x", "certificate-authority": "/nonexistent/ca.crt"}, None, "TLS"),
    ],
)
def test_kubeconfig_errors(tmp_path: Path, tls_dir: Path, case: KubeconfigCase) -> None:
    user, cluster, context, message = case
    with pytest.raises(KubeConfigError, match=message):
        kubeconfig_access(str(_kubeconfig(tmp_path, tls_dir, user, cluster)), context)
    with pytest.raises(KubeConfigError, match="cannot read"):
        kubeconfig_access(str(tmp_path / "nope"))


def test_resolve_access_order(tmp_path: Path, tls_dir: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path, tls_dir, {"token": "abc"})
    from_file = resolve_access(_settings(tmp_path, tls_dir, kubeconfig=str(kubeconfig)), {})
    assert from_file.base_url == "https://127.0.0.1:6443"
    overridden = resolve_access(
        _settings(tmp_path, tls_dir, kubeconfig=str(kubeconfig), api_url="https://k:1"), {}
    )
    assert overridden.base_url == "https://k:1" and overridden.headers() == {"Authorization": "Bearer abc"}
    in_cluster = resolve_access(_settings(tmp_path, tls_dir), {"KUBERNETES_SERVICE_HOST": "127.0.0.1"})
    assert in_cluster.base_url == "https://127.0.0.1:443"
    from_env = resolve_access(_settings(tmp_path, tls_dir), {"KUBECONFIG": str(kubeconfig)})
    assert from_env.namespace == "ml"
    proxy = resolve_access(_settings(tmp_path, tls_dir, api_url="http://127.0.0.1:8001/"), {})
    assert proxy.base_url == "http://127.0.0.1:8001" and proxy.verify is False
    https = resolve_access(_settings(tmp_path, tls_dir, api_url="https://127.0.0.1:6443"), {})
    assert isinstance(https.verify, ssl.SSLContext)
