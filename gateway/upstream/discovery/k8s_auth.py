"""Where the Kubernetes API is and how to authenticate: in-cluster service account, or a kubeconfig.

In-cluster: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the service-account CA, and the
token file re-read for every request (bound service-account tokens are rotated by the kubelet about
hourly; a client that reads the token once starts failing with 401 after it expires).

Kubeconfig (local use): a minimal reader for the common cases: `token`, `tokenFile`, client certificate
and key (paths or `-data`), `certificate-authority(-data)`, `insecure-skip-tls-verify`. `exec` and
`auth-provider` plugins (cloud logins) are not supported: run `kubectl proxy` and set
`api_url: http://127.0.0.1:8001` instead.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.config.discovery_settings import KubernetesReplicas


class KubeConfigError(ValueError):
    """The API location or credentials cannot be determined."""


TokenSource = Callable[[], str | None]


@dataclass(frozen=True, slots=True)
class ApiAccess:
    base_url: str
    verify: ssl.SSLContext | bool
    token: TokenSource
    namespace: str | None = None
    """The namespace the credentials point at (pod namespace or kubeconfig context), if known."""

    def headers(self) -> dict[str, str]:
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}


def _no_token() -> str | None:
    return None


def file_token(path: str) -> TokenSource:
    """Read `path` on every call (rotation); None while it does not exist."""

    def read() -> str | None:
        try:
            return Path(path).read_text().strip() or None
        except FileNotFoundError:
            return None

    return read


def _read_optional(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def _ssl_context(
    cafile: str | None = None, cadata: str | None = None, cert: tuple[bytes, bytes] | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    if cert is not None:
        _load_cert_chain(context, *cert)
    return context


def _load_cert_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` wants files: write them 0600 to a private directory and delete them at once."""
    with tempfile.TemporaryDirectory(prefix="llm-gateway-kube-") as tmp:
        cert_path, key_path = Path(tmp, "client.crt"), Path(tmp, "client.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            path.touch(mode=0o600)
            path.write_bytes(data)
        context.load_cert_chain(str(cert_path), str(key_path))


def in_cluster_access(settings: KubernetesReplicas, environ: Mapping[str, str]) -> ApiAccess:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:
        host = f"[{host}]"
    try:
        verify = _ssl_context(cafile=settings.ca_path)
    except OSError as exc:
        raise KubeConfigError(f"cannot load the service-account CA {settings.ca_path}: {exc}") from None
    return ApiAccess(
        f"https://{host}:{port}",
        verify,
        file_token(settings.token_path),
        _read_optional(settings.namespace_path),
    )


def _named(items: Any, name: str, kind: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            found = item.get(kind)
            return found if isinstance(found, dict) else {}
    raise KubeConfigError(f"kubeconfig: no {kind} named {name!r}")


def _pem(section: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    return (base / path).read_bytes() if path else None


def kubeconfig_access(path: str, context_name: str | None = None) -> ApiAccess:
    """Read a kubeconfig (module docstring for what is supported)."""
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    base = Path(path).resolve().parent
    name = context_name or config.get("current-context")
    if not name:
        raise KubeConfigError(f"kubeconfig {path}: no context given and no current-context")
    context = _named(config.get("contexts"), name, "context")
    cluster = _named(config.get("clusters"), context.get("cluster", ""), "cluster")
    user = _named(config.get("users"), context.get("user", ""), "user") if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(
            f"kubeconfig {path}: exec/auth-provider users are not supported; "
            "run `kubectl proxy` and set api_url: http://127.0.0.1:8001"
        )
    server = str(cluster.get("server", "")).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server URL")
    try:
        verify = _kubeconfig_verify(cluster, user, base, server)
    except (OSError, ValueError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: bad TLS material: {exc}") from None
    token: TokenSource = _no_token
    if user.get("token"):
        fixed = str(user["token"])
        token = lambda: fixed  # noqa: E731
    elif user.get("tokenFile"):
        token = file_token(str(base / user["tokenFile"]))
    return ApiAccess(server, verify, token, context.get("namespace"))


def _kubeconfig_verify(
    cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path, server: str
) -> ssl.SSLContext | bool:
    if server.startswith("http://"):
        return False
    ca = _pem(cluster, "certificate-authority", base)
    context = _ssl_context(cadata=ca.decode() if ca else None)
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = _pem(user, "client-certificate", base), _pem(user, "client-key", base)
    if cert and key:
        _load_cert_chain(context, cert, key)
    return context


def resolve_access(settings: KubernetesReplicas, environ: Mapping[str, str] | None = None) -> ApiAccess:
    """Pick the API access: explicit kubeconfig, else in-cluster, else `$KUBECONFIG`/`~/.kube/config`;
    `api_url` overrides the server (with no kubeconfig: the token and CA files are used when present)."""
    env = os.environ if environ is None else environ
    if settings.kubeconfig:
        access = kubeconfig_access(settings.kubeconfig, settings.context)
    elif settings.api_url:
        https = settings.api_url.startswith("https://")
        verify: ssl.SSLContext | bool = (
            _ssl_context(cafile=settings.ca_path) if https and Path(settings.ca_path).exists() else https
        )
        return ApiAccess(
            settings.api_url.rstrip("/"),
            verify,
            file_token(settings.token_path),
            _read_optional(settings.namespace_path),
        )
    elif env.get("KUBERNETES_SERVICE_HOST"):
        access = in_cluster_access(settings, env)
    else:
        default = env.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
        access = kubeconfig_access(default, settings.context)
    if settings.api_url:
        access = ApiAccess(settings.api_url.rstrip("/"), access.verify, access.token, access.namespace)
    return access


def namespace_for(settings: KubernetesReplicas, access: ApiAccess) -> str:
    return settings.namespace or access.namespace or "default"
