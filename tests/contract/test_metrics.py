"""Metrics (DESIGN §4): the documented `llm_gateway_` names with their label sets on `/metrics`
(Prometheus text format), and no request ids, prompts or session keys in any label."""

from __future__ import annotations

import httpx
import pytest

from tests.contract.conftest import (
    CHAT,
    CLIENT_TIMEOUT,
    MODEL,
    SILENT,
    ContractGateway,
    chat,
    metric_samples,
    replica_id,
)
from tests.waiting import wait_for

# Sample name → its label names (histograms: the `_count` series, so without `le`). `None`: the design
# names the metric without fixing its labels.
DOCUMENTED: dict[str, frozenset[str] | None] = {
    "llm_gateway_requests_total": frozenset({"model", "outcome"}),
    "llm_gateway_request_duration_seconds_count": frozenset({"model"}),
    "llm_gateway_ttft_seconds_count": frozenset({"model"}),
    "llm_gateway_tpot_seconds_count": frozenset({"model"}),
    "llm_gateway_queue_wait_seconds_count": frozenset({"priority"}),
    "llm_gateway_inflight": frozenset({"replica"}),
    "llm_gateway_replica_up": frozenset({"replica"}),
    "llm_gateway_replica_engine_running": None,
    "llm_gateway_replica_engine_waiting": None,
    "llm_gateway_replica_kv_usage_ratio": None,
    "llm_gateway_routing_decisions_total": frozenset({"policy", "branch"}),
    "llm_gateway_retries_total": None,
    "llm_gateway_rejections_total": frozenset({"reason"}),
    "llm_gateway_tokens_total": frozenset({"direction"}),
    "llm_gateway_goodput_tokens_total": None,
    "llm_gateway_breaker_state": frozenset({"replica"}),
}
# `queue_depth{model,priority}` has samples only once something queued: checked in
# `test_error_contract.py::test_queue_full_at_arrival_and_by_displacement`, which reads it by those labels.

REQUEST_ID = "contract-rid-5d1f"
PROMPT = "contract prompt 7a3e about the weather"
SESSION = "contract-session-9c2b"
USER = "contract-user-44f0"
PRIVATE = (REQUEST_ID, PROMPT, SESSION, USER)


@pytest.fixture(scope="module")
def traffic(contract_gateway: ContractGateway) -> ContractGateway:
    """Streamed and non-streamed successes carrying an id, a prompt, a session and a user; a refusal;
    a request retried on the silent pool's second replica."""
    headers = {"x-request-id": REQUEST_ID, "x-session-id": SESSION}
    body = chat(messages=[{"role": "user", "content": PROMPT}], user=USER)
    with httpx.Client(base_url=contract_gateway.url, timeout=CLIENT_TIMEOUT) as client:
        for stream in (False, True):
            assert client.post(CHAT, json={**body, "stream": stream}, headers=headers).status_code == 200
        assert client.post(CHAT, json={**body, "model": "gpt-9"}, headers=headers).status_code == 404
        silent = {**body, "model": SILENT, "stream": True}
        assert client.post(CHAT, json=silent, headers=headers).status_code == 504
    return contract_gateway


def test_documented_metrics_are_exported_with_their_labels(traffic: ContractGateway) -> None:
    contract_gateway = traffic
    # Engine load appears after the first scrape of the replicas (a background loop).
    wait_for(
        lambda: "llm_gateway_replica_engine_running" in metric_samples(contract_gateway.url),
        what="the first engine scrape",
    )
    samples = metric_samples(contract_gateway.url)
    missing = sorted(name for name in DOCUMENTED if name not in samples)
    assert not missing, f"documented metrics without samples: {missing}"
    for name, labels in DOCUMENTED.items():
        label_sets = {frozenset(sample_labels) for sample_labels, _ in samples[name]}
        if labels is not None:
            assert label_sets == {labels}, (name, label_sets)
    for name in ("llm_gateway_replica_engine_running", "llm_gateway_replica_kv_usage_ratio"):
        assert {replica_id(e.url) for e in contract_gateway.engines[MODEL]} <= {
            sample_labels.get("replica") for sample_labels, _ in samples[name]
        }, f"{name} per replica"
    outcomes = {s["outcome"] for s, _ in samples["llm_gateway_requests_total"] if s["model"] == MODEL}
    assert "success" in outcomes, outcomes
    assert {s["direction"] for s, _ in samples["llm_gateway_tokens_total"]} == {"input", "output"}


def test_no_request_ids_prompts_or_session_keys_in_labels(traffic: ContractGateway) -> None:
    contract_gateway = traffic
    text = httpx.get(contract_gateway.url + "/metrics", timeout=CLIENT_TIMEOUT).text
    leaked = [value for value in PRIVATE if value in text]
    assert not leaked, f"request data in /metrics: {leaked}"
    samples = metric_samples(contract_gateway.url)
    assert all(name.startswith("llm_gateway_") for name in samples), "one prefix for every metric"
    label_names = {label for series in samples.values() for labels, _ in series for label in labels}
    forbidden = {"request_id", "prompt", "session", "session_id", "session_key", "user", "messages"}
    assert not label_names & forbidden, label_names & forbidden
