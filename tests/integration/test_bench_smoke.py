"""End to end, in seconds: `bench run` starts 2 fixed-delay mock engines and the gateway (or two gateway
instances) as processes, sends ~50 streamed requests, writes the report and stops everything; `bench
sweep` does the same for each knee probe and each run of its sweep."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from bench.cli import main
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions, GatewayOptions

pytestmark = pytest.mark.slow

ENGINE_FLAGS = ["--first-token-delay-ms", "5", "--token-delay-ms", "1"]


def test_bench_run_through_the_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    argv = ["run", "--replicas", "2", *ENGINE_FLAGS, "--policy", "round-robin"]
    argv += ["--workload", "shared-prefix-small", "-p", "prefix_tokens=64", "-p", "output_tokens=8"]
    argv += ["--requests", "50", "--warmup-requests", "5", "--rate", "40", "--seed", "3"]
    code = main([*argv, "--out", str(out), "--quiet", "--no-plots"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    run = report["runs"][0]
    assert run["label"] == "round-robin" and run["level"] == 40.0
    assert (run["requests"], run["ok"], run["rejected"], run["errors"]) == (45, 45, 0, 0)
    assert run["output_tokens"] == 45 * 8
    assert run["ttft_ms"]["p50"] >= 5.0, "TTFT includes the engine's first-token delay"
    assert run["tpot_ms"]["p50"] >= 0.5
    requests = run["replicas"]["requests"]
    assert len(requests) == 2 and sum(requests.values()) == 45
    assert run["replicas"]["max_mean_ratio"] <= 1.1, "round robin spreads evenly"
    assert run["engine"]["samples"] > 0
    assert run["goodput"]["requests"] == 45
    assert "| round-robin | 40.00 | 45 | 45 | 0 | 0 |" in (out / "report.md").read_text()
    assert len((out / "samples-00-round-robin.jsonl").read_text().splitlines()) == 50
    assert "| round-robin |" in capsys.readouterr().out


def test_bench_run_through_two_gateway_instances(tmp_path: Path) -> None:
    """`--gateway-instances 2`: two gateway processes over the same 2 engines; requests alternate between
    them (each instance's own request counter shows half), and the report is written."""
    out = tmp_path / "report"
    argv = ["run", "--replicas", "2", *ENGINE_FLAGS, "--policy", "prefix-index", "--gateway-instances", "2"]
    argv += ["--workload", "tiny", "--requests", "20", "--rate", "40", "--seed", "3"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plots"]) == 0
    run = json.loads((out / "report.json").read_text())["runs"][0]
    assert (run["requests"], run["ok"], run["errors"]) == (20, 20, 0)
    instances = run["engine"]["gateway_instances"]
    assert len(instances) == 2 and list(instances.values()) == [10, 10], "round robin, one request each"
    assert run["params"]["fleet"]["gateway_instances"] == 2 and len(run["params"]["target"]) == 2
    assert sum(run["replicas"]["requests"].values()) == 20, "every answer named its replica"
    assert "Requests per gateway instance" in (out / "report.md").read_text()
    assert {"gateway-0.log", "gateway-1.log", "gateway-0.yaml"} <= set(os.listdir(out / "logs" / "00"))


def test_bench_compare_aggregated_and_disaggregated_fleets(tmp_path: Path) -> None:
    """One compare, two fresh fleets of 2 physics `tiny` engines: 2 aggregated replicas, and 1 prefill + 1
    decode (`--disagg 1:1`, vLLM protocol, tcp link) behind a disaggregated pool. Every request succeeds
    through the pair (the decode engine refuses a request without the prefill's transfer parameters, so
    an answer means both legs ran); the decode engine answered them all; both engines were scraped."""
    out = tmp_path / "report"
    argv = ["compare", "--replicas", "2", "--core", "physics", "--profile", "tiny", "--kv-link", "tcp"]
    argv += ["--variant", "agg:", "--disagg", "1:1", "--workload", "tiny", "--requests", "20"]
    argv += ["--warmup-requests", "2", "--rate", "40", "--seed", "3", "--sample-interval-s", "0.05"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plots"]) == 0
    runs = {run["label"]: run for run in json.loads((out / "report.json").read_text())["runs"]}
    assert set(runs) == {"agg", "disagg-1p1d"}
    for run in runs.values():
        assert (run["requests"], run["ok"], run["errors"], run["gpus"]) == (18, 18, 0, 2)
        assert len(run["engine"]["mean_load_per_replica"]) == 2, "every engine scraped"
    agg, pair = runs["agg"], runs["disagg-1p1d"]
    assert "disaggregation" not in agg["params"]["fleet"] and len(agg["replicas"]["requests"]) == 2
    fleet = pair["params"]["fleet"]
    assert fleet["disaggregation"] == {"prefill": 1, "decode": 1, "protocol": "vllm", "kv_link": "tcp"}
    answered = pair["replicas"]["requests"]
    assert list(answered.values()) == [18], "one engine, the decode one, answered every request"
    assert set(answered) < set(pair["engine"]["mean_load_per_replica"])
    logs = sorted(os.listdir(out / "logs"))
    assert logs == ["00-agg", "01-disagg-1p1d"]
    config = json.loads((out / "logs" / logs[1] / "gateway.yaml").read_text())
    decode_urls = config["pools"][0]["disaggregation"]["decode"]["replicas"]["static"]
    assert [url.removeprefix("http://") for url in decode_urls] == list(answered)


def test_bench_sweep_finds_the_knee_and_sweeps_two_levels(tmp_path: Path) -> None:
    """2 fixed-delay engines (no batching: the SLO holds at any rate, so the search doubles from 20 req/s
    to its cap of 40), then 0.5× and 1× the knee for `defaults` (a pool cap of 4 from `--pool-set`) and
    `no-admission` (the cap set back to none, no learned cap): 2 probes and 4 runs, each on its own fleet."""
    out = tmp_path / "report"
    argv = ["sweep", "--replicas", "2", *ENGINE_FLAGS, "--workload", "tiny", "--requests", "14"]
    argv += ["--warmup-requests", "2", "--knee-start", "20", "--knee-max", "40", "--levels", "0.5", "1"]
    argv += ["--pool-set", "max_concurrency_per_replica=4", "--seed", "3"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    knee = report["sweep"]["knee"]
    assert [p["rate"] for p in knee["probes"]] == [20.0, 40.0] and all(p["meets"] for p in knee["probes"])
    assert (knee["rate"], knee["ended"]) == (40.0, "max_rate")
    rows = report["sweep"]["rows"]
    assert [(r["entry"], r["offered_rps"], r["level"]) for r in rows] == [
        ("defaults", 20.0, 0.5),
        ("no-admission", 20.0, 0.5),
        ("defaults", 40.0, 1.0),
        ("no-admission", 40.0, 1.0),
    ]
    assert all(r["requests"] == 12 for r in rows), "14 sent, 2 of them warm-up"
    assert all(run["errors"] == 0 and run["ok"] + run["rejected"] == 12 for run in report["runs"])
    assert report["sweep"]["knee_goodput_rps"] == rows[3]["goodput_rps"], "no-admission at 1×"
    logs = sorted(os.listdir(out / "logs"))
    assert logs == ["00-defaults", "01-no-admission", "02-defaults", "03-no-admission", "knee-00", "knee-01"]

    def pool(run: str) -> dict[str, object]:
        return dict(json.loads((out / "logs" / run / "gateway.yaml").read_text())["pools"][0])

    assert pool("00-defaults")["max_concurrency_per_replica"] == 4 and "latency_model" not in pool(
        "00-defaults"
    )
    for run in ("01-no-admission", "knee-00"):
        assert pool(run)["max_concurrency_per_replica"] is None
        assert pool(run)["latency_model"] == {"adaptive_cap": False}
    text = (out / "report.md").read_text()
    assert text.startswith("# bench sweep: tiny\n\nReproduce: `llm-gateway bench sweep --replicas 2")
    assert "## Load sweep" in text and "| 1.00 | 40.00 | no-admission |" in text
    if (out / "latency_cdf.png").exists():
        assert (out / "sweep.png").stat().st_size > 0


def test_fleet_stops_every_process_when_the_run_fails(tmp_path: Path) -> None:
    pids: list[int] = []
    with (
        pytest.raises(RuntimeError, match="boom"),
        Fleet(
            1, EngineOptions(first_token_delay_ms=0, token_delay_ms=0), GatewayOptions(), log_dir=tmp_path
        ) as fleet,
    ):
        assert fleet.gateway_url is not None and fleet.gateway_pid is not None
        assert httpx.get(fleet.gateway_url + "/readyz").status_code == 200
        pids = [proc.pid for _, proc in fleet._procs]
        raise RuntimeError("boom")
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


async def test_raw_sse_client_and_httpx_client_agree_on_a_mock_engine() -> None:
    from bench.client import BenchClient, ClientOptions
    from bench.rawsse import RawSseClient
    from bench.workload import RequestSpec
    from tests.servers import start_mock_engine

    engine = start_mock_engine(model="m", first_token_delay_ms=20, token_delay_ms=2)
    try:
        spec = RequestSpec(messages=(("user", "hello"),), max_tokens=5)
        start = time.perf_counter()
        raw = await RawSseClient(ClientOptions(model="m")).send(engine.url, spec, 0, 0.0, start)
        client = BenchClient(ClientOptions(model="m"))
        via_httpx = await client.send(engine.url, spec, 1, 0.0, start)
        await client.aclose()
    finally:
        engine.stop()
    for sample in (raw, via_httpx):
        assert sample.ok and sample.status == 200
        assert sample.ttft_s is not None and sample.ttft_s >= 0.02
        assert sample.max_gap_s is not None and sample.max_gap_s < 0.5
    assert raw.frames == via_httpx.frames == 8  # role, 5 tokens, finish, usage
    assert raw.output_tokens == via_httpx.output_tokens == 5


def test_bench_reports_the_gateway_side_rejection_latency(tmp_path: Path) -> None:
    """Tenants are configured and the client sends no key: every request is a 401, which the gateway
    times itself; the report carries its histogram over the window (no warm-up: all 20 requests)."""
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "pools: [{model: bench-model, engine: vllm, replicas: {static: []}}]\n"
        "tenants: [{name: only, api_key_hashes: ['" + "0" * 64 + "']}]\n"
    )
    out = tmp_path / "report"
    argv = ["run", "--replicas", "1", *ENGINE_FLAGS, "--gateway-config", str(config)]
    argv += ["--workload", "no-sharing", "-p", "prompt_tokens=16", "-p", "output_tokens=4"]
    argv += ["--requests", "20", "--warmup-requests", "0", "--rate", "40", "--seed", "3"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plots"]) == 1, "no request succeeded: exit 1"
    run = json.loads((out / "report.json").read_text())["runs"][0]
    assert (run["ok"], run["rejected"], run["errors"]) == (0, 0, 20), "a 401 is an error, not a shed"
    gateway_side = run["engine"]["gateway_rejections"]
    assert set(gateway_side) == {"unauthorized"} and gateway_side["unauthorized"]["count"] == 20
    assert 0 < gateway_side["unauthorized"]["p99_ms"] < 1000
    assert "gateway-side × 20" in (out / "report.md").read_text()


def test_bench_run_with_a_fault_schedule_and_poisoned_requests(tmp_path: Path) -> None:
    """Two engines; engine 1 is killed 0.3 s into the measured window and started again at 1 s, engine 0
    gets a run-time fault setting, one event lies past the end of the run; 10 % of the requests carry
    the poison marker (effect: crash). The run ends by itself and the report logs every event."""
    out = tmp_path / "report"
    argv = ["run", "--replicas", "2", "--first-token-delay-ms", "5", "--token-delay-ms", "2"]
    argv += ["--policy", "round-robin", "--workload", "no-sharing", "-p", "prompt_tokens=16"]
    # 120 measured requests at 30/s: a 4 s run, so the restart at 1 s has 3 s to get the engine ready
    # even on a loaded CI machine (with 60 it was once cut short: `interrupted`)
    argv += ["-p", "output_tokens=32", "--requests", "124", "--warmup-requests", "4", "--rate", "30"]
    argv += ["--seed", "3", "--pool-set", "timeouts={ttft_s: 0.5, idle_s: 0.5}"]
    argv += ["--pool-set", "health.interval_s=0.5", "--sample-interval-s", "0.2"]
    argv += ["--fault", "at=0.3s kill=1", "--fault", "at=1s restart=1", "--fault", "at=60s clear=0"]
    argv += ["--fault", "at=1.2s replica=0 set=jitter_ms:1", "--poison-fraction", "0.1"]
    argv += ["--poison-effect", "crash"]
    started = time.monotonic()
    main([*argv, "--out", str(out), "--quiet", "--no-plots"])
    assert time.monotonic() - started < 60
    run = json.loads((out / "report.json").read_text())["runs"][0]
    events = {e["fault"]: e for e in run["faults"]}
    assert [e["status"] for e in run["faults"]] == ["done", "done", "done", "skipped"]
    assert events["at=0.3s kill=1"]["detail"].startswith("SIGKILL pid")
    assert events["at=1s restart=1"]["ready_at_s"] is not None
    assert events["at=60s clear=0"]["ran_at_s"] is None
    answers = run["answers"]
    assert answers["all"]["requests"] == 120 and answers["poisoned"]["requests"] >= 1
    assert answers["poisoned"]["complete"] == 0, "a poisoned request never completes"
    assert answers["good"]["complete_ratio"] >= 0.9
    assert answers["all"]["short"] == 0
    gateway = run["engine"]["gateway"]
    assert gateway["breakers"]["reads"] > 0 and "upstream_failures" in gateway["counters"]
    report = (out / "report.md").read_text()
    assert "Answers under faults" in report and "`at=1s restart=1`" in report
    assert "engine-1.1.log" in os.listdir(out / "logs" / "00"), "the restarted engine logs apart"
