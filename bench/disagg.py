"""A disaggregated local fleet: P prefill and D decode mock engines and the gateway pool that pairs them.

`--disagg [LABEL=]P:D[@LINK]` (bench run: one; bench compare: each is an entry, beside aggregated ones)
starts P + D engines with the same core, profile and speed as an aggregated fleet: engines 0…P−1 with
`--role prefill`, engines P…P+D−1 with `--role decode`, all with `--disagg-protocol PROTOCOL` and
`--kv-link LINK` (the entry's `@LINK`, else `--kv-link`, else the engine's default: the profile's
link, else rdma). The gateway's pool for the model gets a `disaggregation:` section
(docs/DISAGGREGATION.md) instead of `replicas:`:

    disaggregation:
      protocol: vllm
      prefill: {replicas: {static: [engines 0…P−1]}}
      decode:  {replicas: {static: [engines P…P+D−1]}}

The pool's own `replicas`, `policy` and `max_concurrency_per_replica` are set per side in a
disaggregated pool (the gateway refuses them at the top): a cap the template or `--pool-set` gives the
pool is given to both sides; a policy is dropped (each side keeps its default, prefix-index for
prefill, least-load for decode; `--pool-set disaggregation.prefill.policy=NAME` sets one). Keys the
template or `--pool-set` give under `disaggregation.` are merged into the generated section, one level
deep (`disaggregation.decode.max_concurrency_per_replica=64` keeps the generated decode replicas).

The default label is `disagg-<P>p<D>d` (plus `-<LINK>` when the entry names a link).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("vllm", "sglang")
LINK_PRESETS = ("nvlink", "rdma", "tcp")
_SPEC = re.compile(r"^(?:(?P<label>[^=]+)=)?\s*(?P<p>\d+):(?P<d>\d+)(?:@(?P<link>[^@\s]+))?$")
SET_KEYS = ("replicas", "policy", "max_concurrency_per_replica")
"""Pool keys a disaggregated pool takes per side (gateway/config/disagg_settings.py)."""


@dataclass(frozen=True, slots=True)
class DisaggSpec:
    """P prefill + D decode engines, the protocol between them and the KV link (None: the engine's)."""

    prefill: int
    decode: int
    protocol: str = "vllm"
    kv_link: str | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ValueError(f"a disaggregated fleet needs >= 1 prefill and >= 1 decode engine, got {self}")
        if self.protocol not in PROTOCOLS:
            known = ", ".join(PROTOCOLS)
            raise ValueError(f"disaggregation protocol {self.protocol!r} is not one of {known}")
        if self.kv_link is not None:
            check_link(self.kv_link)

    @property
    def replicas(self) -> int:
        """Engines (simulated GPUs) of the fleet: P + D."""
        return self.prefill + self.decode

    def role(self, replica: int) -> str:
        """`prefill` for engines 0…P−1, `decode` for P…P+D−1."""
        if not 0 <= replica < self.replicas:
            raise ValueError(f"engine {replica} is not in a {self.prefill}:{self.decode} fleet")
        return "prefill" if replica < self.prefill else "decode"

    def engine_args(self, replica: int) -> list[str]:
        """The mock-engine flags of engine `replica` (added to the common ones)."""
        args = ["--role", self.role(replica), "--disagg-protocol", self.protocol]
        return args + (["--kv-link", self.kv_link] if self.kv_link is not None else [])

    def describe(self) -> dict[str, Any]:
        sides = {"prefill": self.prefill, "decode": self.decode}
        return {**sides, "protocol": self.protocol, "kv_link": self.kv_link}


def check_link(link: str) -> str:
    """A `--kv-link` value: a preset name or a positive bandwidth in GB/s; ValueError otherwise."""
    if link in LINK_PRESETS:
        return link
    try:
        ok = float(link) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"KV link {link!r} is not one of {', '.join(LINK_PRESETS)} nor a bandwidth in GB/s")
    return link


def parse_disagg(text: str, protocol: str = "vllm", kv_link: str | None = None) -> DisaggSpec:
    """`[LABEL=]P:D[@LINK]` → a spec; `protocol` and `kv_link` are the defaults the entry may override
    (the link). ValueError when the text has another shape or the counts are < 1."""
    match = _SPEC.match(text.strip())
    if match is None:
        raise ValueError(f"--disagg {text!r} is not [LABEL=]PREFILL:DECODE[@LINK], e.g. 2:2 or 1:3@tcp")
    link = match["link"]
    prefill, decode = int(match["p"]), int(match["d"])
    default_label = f"disagg-{prefill}p{decode}d" + (f"-{link}" if link else "")
    label = (match["label"] or "").strip() or default_label
    return DisaggSpec(prefill, decode, protocol, link if link is not None else kv_link, label)


def disaggregate(pool: dict[str, Any], spec: DisaggSpec, engine_urls: list[str]) -> None:
    """Turn `pool` (a gateway pool mapping, edited in place) into a disaggregated pool over
    `engine_urls` (the fleet's engines in order: the first P prefill, the rest decode); see the module
    docstring for what happens to the pool's own keys."""
    if len(engine_urls) != spec.replicas:
        shape = f"{spec.prefill}:{spec.decode}"
        raise ValueError(f"{shape} needs {spec.replicas} engines, got {len(engine_urls)}")
    cap = pool.get("max_concurrency_per_replica")
    for key in SET_KEYS:
        pool.pop(key, None)
    sides: dict[str, Any] = {
        "prefill": {"replicas": {"static": engine_urls[: spec.prefill]}},
        "decode": {"replicas": {"static": engine_urls[spec.prefill :]}},
    }
    if cap is not None:
        for side in sides.values():
            side["max_concurrency_per_replica"] = cap
    generated: dict[str, Any] = {"protocol": spec.protocol, **sides}
    for key, value in (pool.get("disaggregation") or {}).items():  # the template's / --pool-set's keys
        current = generated.get(key)
        both = isinstance(current, dict) and isinstance(value, dict)
        generated[key] = {**current, **value} if both else value  # type: ignore[dict-item]
    pool["disaggregation"] = generated
