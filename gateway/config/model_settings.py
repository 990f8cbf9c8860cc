"""What names a pool answers to besides its `model`: other models and LoRA adapters its replicas serve.

A vLLM replica rarely serves one model: it serves a base model plus LoRA adapters (`--lora-modules`,
or loaded at run time), and lists them in its `/v1/models` with their `parent`. A pool's `models`
says which of those names clients may ask for (`gateway.upstream.model_catalog`):

- `names`: served besides `model` — adapters started with every replica, or other models of a
  multi-model server. Without discovery every replica is taken to serve them.
- `discover` (default off): read each replica's `/v1/models` every `refresh_s` (bounded by
  `timeout_s`). Each entry with a `parent` (an adapter) becomes a name of the pool, served only by
  the replicas that list it; the base model (no parent) is the pool's `model` whatever its engine
  name; a parentless entry that is not the base is served only when it is in `names`. A replica not
  yet read, or whose last read failed, keeps its last known list (before the first read: `model` and
  `names`): one failed read never withdraws an adapter.

A request for a name routes only to replicas that serve it (`router.eligibility`); its name is part
of its prefix key (an adapter's KV cache is its own); its queue is its own within the pool's admission
(`gateway.proxy.admit`), so requests for an adapter waiting for its few replicas never hold up the
base model's.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from gateway.config.strict_model import StrictModel


class ServedModelSettings(StrictModel):
    """A pool's `models:` (module docstring)."""

    names: list[str] = Field(default_factory=list)
    discover: bool = False
    refresh_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    timeout_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    adapters: dict[str, str] = Field(default_factory=dict)
    """LoRA adapters the gateway may load at run time, name → the path the engine loads it from
    (`gateway.proxy.adapter_loading`; vLLM with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Needs
    `discover`: the gateway must know which replicas already hold them."""
    max_adapters_per_replica: int | None = Field(None, ge=1)
    """The most adapters the gateway leaves loaded on one replica (those it lists beyond the pool's
    declared names); None: no bound. The gateway never unloads one."""
    load_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)

    @field_validator("names")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if any(not name for name in names):
            raise ValueError("model names must be non-empty")
        if len(set(names)) != len(names):
            raise ValueError("model names must be distinct")
        return names

    @model_validator(mode="after")
    def _loading_needs_discovery(self) -> ServedModelSettings:
        if self.adapters and not self.discover:
            raise ValueError("adapters: loading adapters at run time needs discover: true")
        overlap = set(self.adapters) & set(self.names)
        if overlap:
            raise ValueError(
                f"adapters: {', '.join(sorted(overlap))} also in names (served everywhere already)"
            )
        return self
