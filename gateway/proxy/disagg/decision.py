"""The routing decision a disaggregated request answers with: the decode replica's (it is the replica
that answers the client: `x-gateway-replica`), and the prefill replica's in `x-gateway-route`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from router.types import Decision


@dataclass(frozen=True, slots=True)
class PairDecision(Decision):
    """`x-gateway-route`: the decode decision's fields, then `; prefill=<id>; prefill_policy=…
    [; prefill_prefix_blocks=…]; decode=<id>`."""

    prefill_replica_id: str = ""
    prefill_policy: str = ""
    prefill_prefix_blocks: int | None = None

    @classmethod
    def of(cls, prefill: Decision, decode: Decision) -> PairDecision:
        own = {f.name: getattr(decode, f.name) for f in fields(Decision)}
        return cls(
            **own,
            prefill_replica_id=prefill.replica_id,
            prefill_policy=prefill.policy,
            prefill_prefix_blocks=prefill.detail.get("matched_prefix_blocks"),
        )

    def header_value(self) -> str:
        value = f"{Decision.header_value(self)}; prefill={self.prefill_replica_id}"
        value += f"; prefill_policy={self.prefill_policy}"
        if self.prefill_prefix_blocks is not None:
            value += f"; prefill_prefix_blocks={self.prefill_prefix_blocks}"
        return value + f"; decode={self.replica_id}"
