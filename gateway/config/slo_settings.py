"""A pool's service-level objectives (`pools[].slo` in the config): the latency objective that defines
goodput, the availability objective with the request outcomes it leaves out, the burn-rate alerts on
both, and the queue-wait bound the TTFT objective puts on admission. Kept apart from the rest of a
pool's settings because these models are what the SLO accounting, the alert rules and the SLO headers
read, and the outcome names tie them to the error codes; every model forbids unknown keys.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from admission.slo_wait import DEFAULT_QUEUE_WAIT_RATIO
from gateway.base.errors import ErrorCode
from gateway.config.strict_model import StrictModel

CLIENT_DISCONNECT_OUTCOME = "client_disconnect"
"""The `outcome` label of a request whose client left (gateway.proxy.account.OUTCOME_CLIENT_DISCONNECT)."""
KNOWN_OUTCOMES = frozenset({*(str(code) for code in ErrorCode), CLIENT_DISCONNECT_OUTCOME})
"""Every value of `llm_gateway_requests_total{outcome}` but `success`: error codes, the client leaving."""
DEFAULT_AVAILABILITY_EXCLUDED_OUTCOMES = (
    # the client's own input or credentials: nothing the fleet could have served
    "bad_request",
    "model_not_found",
    "too_large",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "request_timeout",
    "request_quarantined",
    "endpoint_not_served",
    "response_not_found",
    # the tenant over its own quota: the contract working, not the fleet failing
    "rate_limited",
    # the client left: nothing to judge
    CLIENT_DISCONNECT_OUTCOME,
)


class BurnRateAlert(StrictModel):
    """One multi-window burn-rate alert (SRE workbook, "multiwindow, multi-burn-rate alerts"): it fires
    while the error ratio over BOTH windows exceeds `burn_rate` × (1 − objective), i.e. the error budget
    burns `burn_rate` times faster than the objective allows. The long window makes it significant (14.4×
    over 1 h spends 2 % of a 30-day budget; 6× over 6 h spends 5 %); the short window (1/12 of the long
    one) makes it resolve minutes after the burn stops. Windows are whole seconds (Prometheus durations)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    burn_rate: float = Field(gt=0)
    long_window_s: int = Field(gt=0)
    short_window_s: int = Field(gt=0)
    severity: str = Field("page", min_length=1)

    @model_validator(mode="after")
    def _short_within_long(self) -> BurnRateAlert:
        if self.short_window_s >= self.long_window_s:
            raise ValueError("short_window_s must be shorter than long_window_s")
        return self


DEFAULT_BURN_RATE_ALERTS = (
    BurnRateAlert(name="fast", burn_rate=14.4, long_window_s=3600, short_window_s=300, severity="page"),
    BurnRateAlert(name="slow", burn_rate=6.0, long_window_s=21600, short_window_s=1800, severity="ticket"),
)


class SloSettings(StrictModel):
    """The latency objective a request must meet to count as goodput (the field's definition: both
    TTFT and TPOT within bounds; an unset bound always holds), and the pool's two SLOs with their
    burn-rate alerts (`llm-gateway alerts`, gateway/fleet/alert_rules.py):

    - latency: `objective_ratio` (default 0.99) of the requests the goodput test ran on (successes with a
      completion token count, `llm_gateway_slo_requests_total`) met it (`llm_gateway_goodput_requests_total`);
    - availability: `availability_objective_ratio` (default 0.999) of the pool's requests were not failed
      by the gateway or the engines. Failed = every outcome but `success` and the
      `availability_excluded_outcomes`, which count neither way (default: client errors — 400, 401, 404,
      405, 408, 413, 422 quarantined —, `rate_limited` (the tenant's own quota) and `client_disconnect`).
      Load shedding for lack of capacity (`queue_full`, `queue_timeout`, `no_replica`,
      `connection_limit`) and `draining` count as failures: sustained shedding is what scaling must fix.
      `upstream_status` (an engine's error passed through) counts as a failure although it may be an
      engine 4xx: the outcome label does not carry the status; exclude it here if your clients' own
      engine 4xx (prompt over the context window) dominate.
    """

    ttft_s: float | None = Field(2.0, gt=0)
    tpot_s: float | None = Field(0.05, gt=0)
    objective_ratio: float = Field(0.99, gt=0, lt=1)
    availability_objective_ratio: float = Field(0.999, gt=0, lt=1)
    availability_excluded_outcomes: tuple[str, ...] = DEFAULT_AVAILABILITY_EXCLUDED_OUTCOMES
    burn_rate_alerts: tuple[BurnRateAlert, ...] = DEFAULT_BURN_RATE_ALERTS
    queue_wait_ratio: float | None = Field(DEFAULT_QUEUE_WAIT_RATIO, gt=0, le=1)
    """A request of a bound class waits at most `queue_wait_ratio × ttft_s` in the gateway's queue
    (admission/slo_wait.py): later it could not meet its TTFT objective, so it is refused (429 with
    Retry-After, early at arrival when the forecast says so). None: classes wait their `max_wait_s`."""
    bound_classes: tuple[str, ...] | None = None
    """The classes whose wait the TTFT objective bounds; None: every class but the lowest."""

    @field_validator("availability_excluded_outcomes")
    @classmethod
    def _known_outcomes(cls, outcomes: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(outcomes) - KNOWN_OUTCOMES)
        if unknown:
            raise ValueError(f"unknown outcome(s) {unknown}; known: {', '.join(sorted(KNOWN_OUTCOMES))}")
        return outcomes

    @model_validator(mode="after")
    def _alerts_can_fire(self) -> SloSettings:
        """An alert whose threshold error ratio burn_rate × (1 − objective) is ≥ 1 could never fire."""
        names = [alert.name for alert in self.burn_rate_alerts]
        if len(set(names)) != len(names):
            raise ValueError("burn_rate_alerts: names must be unique")
        for alert in self.burn_rate_alerts:
            for key, objective in (
                ("objective_ratio", self.objective_ratio),
                ("availability_objective_ratio", self.availability_objective_ratio),
            ):
                if alert.burn_rate * (1 - objective) >= 1:
                    raise ValueError(
                        f"burn_rate_alerts: {alert.name}: burn_rate {alert.burn_rate} × (1 − {key} "
                        f"{objective}) ≥ 1: the alert could never fire"
                    )
        return self
