"""The mock engine's configuration (`MockEngineConfig`), as the CLI (`cli.py`) or a test builds it.

Models and adapters (`served_models.py`, docs/MOCK_ENGINE.md "Models and LoRA adapters"): `model` and
`model_aliases` are the base model's names, `lora_modules` the adapters served from the start,
`allow_runtime_lora` adds the load/unload endpoints, `max_loras` bounds the adapters of the running batch
(the core's rule, `core.py`); `check_model` (default: on exactly when LoRA is enabled or aliases are
given) makes a request for a model not served a 404.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mock_engine.core import DEFAULT_MAX_LORAS
from mock_engine.disagg_role import DisaggConfig
from mock_engine.served_models import LoraModule


@dataclass(frozen=True, slots=True)
class MockEngineConfig:
    model: str = "mock-model"
    default_max_tokens: int = 64
    speed: float = 1.0
    metrics_flavour: str = "vllm"
    max_context_tokens: int | None = None
    """prompt + max_tokens above this is a 400, as vLLM answers past max_model_len."""
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    """Prefill or decode role of a disaggregated pool (`disagg_role.py`); role both by default."""
    model_aliases: tuple[str, ...] = ()
    """More names of the base model (vLLM's further `--served-model-name`s); answers carry `model`."""
    model_root: str | None = None
    """The base model's `root` in /v1/models (vLLM's `--model` path); default `model`."""
    lora_modules: tuple[LoraModule, ...] = ()
    """Adapters served from the start (`--lora-modules`)."""
    max_loras: int = DEFAULT_MAX_LORAS
    """Most distinct adapters in the running batch (vLLM's `--max-loras`)."""
    allow_runtime_lora: bool = False
    """The load/unload endpoints exist (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`)."""
    max_adapters: int | None = None
    """Mock only: most adapters listed at once; a load past it is a 400 (None: no bound, as vLLM)."""
    check_model: bool | None = None
    """404 for a `model` not served; None: on with LoRA or aliases, else any name is accepted."""
