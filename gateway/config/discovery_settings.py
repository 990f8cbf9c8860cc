"""Configuration of a pool's replica source: `static`, `dns` or `kubernetes` (exactly one).

`ReplicaSources` is the model for `pools[].replicas`; it keeps the `static` key of the original
`StaticReplicas` so existing configs stay valid. This module imports nothing from `gateway.config.settings`
(which imports it), so there is no cycle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

IN_CLUSTER_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DnsReplicas(_Strict):
    """Resolve `name` (a headless Service) every `refresh_s`; one replica per A/AAAA address."""

    name: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    refresh_s: float = Field(5.0, gt=0)
    scheme: Literal["http", "https"] = "http"
    drain_grace_s: float = Field(30.0, ge=0)
    """How long an address that left the DNS answer is still announced as `draining` before the source
    forgets it (the registry then drops it once its in-flight count is zero)."""


class KubernetesReplicas(_Strict):
    """Watch the EndpointSlices of one Service (`service`) or of Services matching `selector`."""

    namespace: str | None = None
    """Default: the pod's own namespace (service-account mount), else `default`."""
    service: str | None = None
    selector: str | None = None
    """A label selector over EndpointSlices; slices carry their Service's labels."""
    port: int | str | None = None
    """Port number, or the port's name in the Service; default: the slice's only port."""
    scheme: Literal["http", "https"] = "http"
    api_url: str | None = None
    """Default: in-cluster (`KUBERNETES_SERVICE_HOST`/`_PORT`), else the kubeconfig's server."""
    kubeconfig: str | None = None
    """Path of a kubeconfig for running outside the cluster (token or client-cert users)."""
    context: str | None = None
    token_path: str = f"{IN_CLUSTER_DIR}/token"
    ca_path: str = f"{IN_CLUSTER_DIR}/ca.crt"
    namespace_path: str = f"{IN_CLUSTER_DIR}/namespace"
    watch_timeout_s: int = Field(60, ge=1, le=3600)
    """Server-side `timeoutSeconds` of one watch request; the client read timeout is this plus slack,
    so a silently dead connection is noticed within it."""
    request_timeout_s: float = Field(10.0, gt=0)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    max_stale_s: float | None = Field(300.0, gt=0)
    """When the API has been unreachable this long, every known endpoint becomes `draining` (no new
    requests) until a fresh list succeeds. `null` keeps the last known set routable forever."""

    @field_validator("port")
    @classmethod
    def _port(cls, port: int | str | None) -> int | str | None:
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, int) and not 1 <= port <= 65535:
            raise ValueError(f"port must be 1..65535 or a port name, got {port}")
        if isinstance(port, str) and not port:
            raise ValueError("port name must not be empty")
        return port

    @model_validator(mode="after")
    def _one_target(self) -> KubernetesReplicas:
        if (self.service is None) == (self.selector is None):
            raise ValueError("set exactly one of 'service' or 'selector'")
        return self

    def label_selector(self) -> str:
        if self.service is not None:
            return f"kubernetes.io/service-name={self.service}"
        return self.selector or ""


class ReplicaSources(_Strict):
    """`pools[].replicas`: a static list, or one dynamic source."""

    static: list[str] = Field(default_factory=list)
    dns: DnsReplicas | None = None
    kubernetes: KubernetesReplicas | None = None

    @field_validator("static")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"replica URL must start with http:// or https://, got {url!r}")
        return [u.rstrip("/") for u in urls]

    @model_validator(mode="after")
    def _one_source(self) -> ReplicaSources:
        dynamic = [name for name in ("dns", "kubernetes") if getattr(self, name) is not None]
        if len(dynamic) > 1 or (dynamic and self.static):
            used = (["static"] if self.static else []) + dynamic
            raise ValueError(f"set one replica source, not {' and '.join(used)}")
        return self

    @property
    def dynamic(self) -> bool:
        return self.dns is not None or self.kubernetes is not None
