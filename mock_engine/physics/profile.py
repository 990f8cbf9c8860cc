"""Engine profiles: the model, GPU and scheduler numbers the physics core is calibrated from.

Memory (DESIGN §7; all byte counts are decimal: 1 GB = 10⁹ bytes):

    kv_bytes_per_token = 2 · n_layers · n_kv_heads · d_head · bytes_per_element
    kv_budget_bytes    = hbm_bytes - weight_bytes - overhead_bytes
    kv_capacity_tokens = floor(kv_budget_bytes / kv_bytes_per_token)
    kv_capacity_blocks = floor(kv_capacity_tokens / block_size_tokens)   (the allocator's unit)

    h100-13b-fp16: 2 · 40 · 8 · 128 · 2 = 163,840 B/token; (80 - 26 - 10) · 10⁹ B → 268,554 tokens.

Time of one engine step (one forward pass over every scheduled token):

    step_s = step_overhead_s
           + weight_bytes / memory_bandwidth_bytes_per_s                      weights read once per step
           + Σ_decode ctx_i · kv_bytes_per_token / (memory_bandwidth · kv_read_efficiency_ratio)
           + prefill_tokens / prefill_tokens_per_s                            compute-bound prefill

where ctx_i is the context (KV tokens, including the token being decoded) of each decoding sequence.
Decode is bandwidth-bound: per-stream speed 1 / step_s falls as batch size and context grow. The
attention read runs below peak bandwidth (paged, per-sequence gathers), hence the efficiency ratio; for
h100-13b-fp16 it is calibrated to 0.345 so that, at context 800, step_s ≈ 7.76 ms + 0.113 ms · batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mock_engine.physics.kv_link import KvLink


class ProfileError(ValueError):
    """A profile could not be found or is invalid; the message names the offending key."""


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """The model's shape as far as KV memory and weight reads are concerned."""

    n_layers: int
    n_kv_heads: int
    d_head: int
    bytes_per_element: int
    weight_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) · n_layers · n_kv_heads · d_head · bytes_per_element."""
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * self.bytes_per_element


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """The accelerator: HBM size, memory reserved for activations/runtime, and HBM bandwidth."""

    hbm_bytes: int
    overhead_bytes: int
    memory_bandwidth_bytes_per_s: float


@dataclass(frozen=True, slots=True)
class PrefillSpec:
    """Compute-bound prefill rate, and the optional per-step token budget of chunked prefill.

    `chunk_tokens_per_step` None: a prompt is prefilled whole in the step that admits it. An integer:
    each step schedules at most that many tokens (decode tokens first, then prefill chunks), like vLLM's
    `max_num_batched_tokens` with chunked prefill on.
    """

    tokens_per_s: float
    chunk_tokens_per_step: int | None = None


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """Decode step model: KV read efficiency (fraction of peak bandwidth) and a fixed per-step cost."""

    kv_read_efficiency_ratio: float
    step_overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """Continuous-batching limits: the running-batch cap and the KV allocation unit."""

    max_num_seqs: int
    block_size_tokens: int


@dataclass(frozen=True, slots=True)
class CalibrationTarget:
    """Expected per-stream decode speed at a batch size (at the profile's calibration context)."""

    batch_size: int
    per_stream_tok_s: float

    @property
    def aggregate_tok_s(self) -> float:
        """batch_size · per_stream_tok_s."""
        return self.batch_size * self.per_stream_tok_s


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Everything the physics core needs, with the derived quantities of the module docstring."""

    name: str
    model: ModelGeometry
    gpu: GpuSpec
    prefill: PrefillSpec
    decode: DecodeSpec
    scheduler: SchedulerSpec
    calibration_context_tokens: int = 800
    calibration_targets: tuple[CalibrationTarget, ...] = ()
    description: str = ""
    kv_link: KvLink | None = None
    """The prefill→decode KV link of a disaggregated pool (`kv_link.py`); None: the default preset."""

    def __post_init__(self) -> None:
        if self.kv_budget_bytes < self.model.kv_bytes_per_token * self.scheduler.block_size_tokens:
            raise ProfileError(
                f"gpu.hbm_bytes: leaves no KV memory after model.weight_bytes and gpu.overhead_bytes "
                f"(budget {self.kv_budget_bytes} B, need at least one block; profile {self.name!r})"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """See `ModelGeometry.kv_bytes_per_token`."""
        return self.model.kv_bytes_per_token

    @property
    def kv_budget_bytes(self) -> int:
        """hbm_bytes - weight_bytes - overhead_bytes."""
        return self.gpu.hbm_bytes - self.model.weight_bytes - self.gpu.overhead_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        """floor(kv_budget_bytes / kv_bytes_per_token)."""
        return self.kv_budget_bytes // self.kv_bytes_per_token

    @property
    def kv_capacity_blocks(self) -> int:
        """floor(kv_capacity_tokens / block_size_tokens): the blocks the allocator hands out."""
        return self.kv_capacity_tokens // self.scheduler.block_size_tokens

    @property
    def weight_read_s(self) -> float:
        """weight_bytes / memory_bandwidth_bytes_per_s: the floor of every step."""
        return self.model.weight_bytes / self.gpu.memory_bandwidth_bytes_per_s

    @property
    def kv_read_s_per_token(self) -> float:
        """kv_bytes_per_token / (memory_bandwidth · kv_read_efficiency_ratio)."""
        effective_bytes_per_s = self.gpu.memory_bandwidth_bytes_per_s * self.decode.kv_read_efficiency_ratio
        return self.kv_bytes_per_token / effective_bytes_per_s

    def step_s(self, decode_context_tokens: int, prefill_tokens: int) -> float:
        """Duration of one engine step (module docstring); `decode_context_tokens` = Σ ctx_i."""
        return (
            self.decode.step_overhead_s
            + self.weight_read_s
            + decode_context_tokens * self.kv_read_s_per_token
            + prefill_tokens / self.prefill.tokens_per_s
        )

    def decode_tok_s(self, batch_size: int, context_tokens: int) -> float:
        """Closed-form per-stream decode speed of a steady batch: 1 / step_s(batch · ctx, 0)."""
        return 1.0 / self.step_s(batch_size * context_tokens, 0)
