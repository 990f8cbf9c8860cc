"""A request's latency objectives: `x-slo-ttft-ms` / `x-slo-tpot-ms`, else the pool's `slo`.

    x-slo-ttft-ms → slo_ttft_s = value / 1000      (positive integer milliseconds)
    x-slo-tpot-ms → slo_tpot_s = value / 1000

They reach routing in the `RoutingRequest` (the `predicted-latency` policy picks the replica predicted
to meet them, `router.cost_aware`). Either header may tighten or loosen the pool's objective; no
ceiling applies, since an objective only steers the choice and the goodput count, it holds nothing.
A header that is not a positive integer is a 400 `bad_request`, as for the timer headers.
"""

from __future__ import annotations

from gateway.config.slo_settings import SloSettings
from gateway.proxy.timers import milliseconds_header_s

SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"


def _objective_s(name: str, raw: str | None, default_s: float | None) -> float | None:
    return default_s if raw is None else milliseconds_header_s(name, raw)


def request_slo(
    slo: SloSettings, ttft_header: str | None, tpot_header: str | None
) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) objectives in seconds for one request (module docstring); None: no bound."""
    return (
        _objective_s(SLO_TTFT_HEADER, ttft_header, slo.ttft_s),
        _objective_s(SLO_TPOT_HEADER, tpot_header, slo.tpot_s),
    )
