"""The link that carries a prompt's KV cache from a prefill replica to a decode replica.

    kv_transfer_s = latency_s + prompt_tokens · kv_bytes_per_token / bandwidth_bytes_per_s

`kv_bytes_per_token` is the model's (`ModelGeometry.kv_bytes_per_token`, 2 · layers · kv_heads · d_head ·
dtype bytes). Presets, effective one-way bandwidth (decimal GB, 10⁹ B):

| preset   | bandwidth   | what it stands for                                                           |
|----------|-------------|------------------------------------------------------------------------------|
| `nvlink` | 450 GB/s    | NVLink 4 on H100 SXM: 900 GB/s total is 450 GB/s each way (same node)        |
| `rdma`   | 50 GB/s     | one 400 Gb/s InfiniBand NDR / RoCE NIC per GPU (400 / 8 = 50 GB/s), NIXL/UCX |
| `tcp`    | 10 GB/s     | 100 GbE over TCP: 12.5 GB/s line rate, ≈ 10 GB/s effective                   |

Default `rdma` (the usual cross-node disaggregation). h100-13b-fp16 (163,840 B/token), 8,192-token
prompt = 1.34 GB: nvlink 3.0 ms, rdma 26.8 ms, tcp 134 ms. Latency defaults to 0 (a handshake is
microseconds, far below the bulk time at these sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from mock_engine.physics.profile import ProfileError

GB_BYTES = 1_000_000_000


@dataclass(frozen=True, slots=True)
class KvLink:
    """One prefill→decode KV path: effective bandwidth (bytes/s) and a fixed per-transfer latency."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        got = self.bandwidth_bytes_per_s
        if not got > 0:
            raise ProfileError(f"kv_link.bandwidth_bytes_per_s: must be > 0, got {got!r}")
        if not self.latency_s >= 0:
            raise ProfileError(f"kv_link.latency_s: must be >= 0, got {self.latency_s!r}")

    def transfer_s(self, prompt_tokens: int, kv_bytes_per_token: int) -> float:
        """latency_s + prompt_tokens · kv_bytes_per_token / bandwidth_bytes_per_s (0 tokens: latency only)."""
        return self.latency_s + max(prompt_tokens, 0) * kv_bytes_per_token / self.bandwidth_bytes_per_s


KV_LINK_PRESETS: dict[str, KvLink] = {
    "nvlink": KvLink("nvlink", 450 * GB_BYTES),
    "rdma": KvLink("rdma", 50 * GB_BYTES),
    "tcp": KvLink("tcp", 10 * GB_BYTES),
}
DEFAULT_KV_LINK = KV_LINK_PRESETS["rdma"]


def parse_kv_link(text: str) -> KvLink:
    """A preset name (`nvlink`, `rdma`, `tcp`) or an effective bandwidth in GB/s (`25`, `12.5`).

    Raises `ProfileError` naming the choices for anything else (≤ 0, not a number, unknown name)."""
    preset = KV_LINK_PRESETS.get(text)
    if preset is not None:
        return preset
    try:
        gb_per_s = float(text)
    except ValueError:
        known = ", ".join(KV_LINK_PRESETS)
        raise ProfileError(f"kv_link: {text!r} is neither a preset ({known}) nor GB/s") from None
    return KvLink(f"{gb_per_s:g}GB/s", gb_per_s * GB_BYTES)
