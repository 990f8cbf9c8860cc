# ruff: noqa: E501  (engines print long HELP and label lines; the fixtures keep them verbatim)
"""/metrics bodies shaped like each engine's real output (names, labels, HELP/TYPE, histograms, number
formatting), modelled on the sources recorded in `gateway/upstream/engine_metrics/flavours.py`."""

from __future__ import annotations

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_L = f'engine="0",model_name="{VLLM_MODEL}"'

# vLLM V1 (0.10.x), one engine: prometheus_client rendering, process/python collectors first.
VLLM_V1 = f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12453.0
python_gc_objects_collected_total{{generation="1"}} 3121.0
python_gc_objects_collected_total{{generation="2"}} 871.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"}} 1.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2.147483648e+09
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 97.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{_L}}} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{_L}}} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{{_L}}} 0.4375
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{_L}}} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{_L}}} 48213.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{_L}}} 30720.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{_L}}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{_L}}} 48213.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{_L}}} 91234.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{_L},finished_reason="stop"}} 311.0
vllm:request_success_total{{{_L},finished_reason="length"}} 12.0
vllm:request_success_total{{{_L},finished_reason="abort"}} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.001"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.005"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.01"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.02"}} 4.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.04"}} 61.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.06"}} 150.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.08"}} 212.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.1"}} 260.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.25"}} 310.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.5"}} 322.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="0.75"}} 325.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="1.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="2.5"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="5.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="7.5"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="10.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="20.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="40.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="80.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="160.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="640.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="2560.0"}} 326.0
vllm:time_to_first_token_seconds_bucket{{{_L},le="+Inf"}} 326.0
vllm:time_to_first_token_seconds_count{{{_L}}} 326.0
vllm:time_to_first_token_seconds_sum{{{_L}}} 24.71928572654724
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.01"}} 88112.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.025"}} 90877.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.05"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.075"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.1"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.15"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.2"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.3"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.4"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.5"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="0.75"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="1.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="2.5"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="5.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="7.5"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="10.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="20.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="40.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="80.0"}} 90908.0
vllm:time_per_output_token_seconds_bucket{{{_L},le="+Inf"}} 90908.0
vllm:time_per_output_token_seconds_count{{{_L}}} 90908.0
vllm:time_per_output_token_seconds_sum{{{_L}}} 812.3406727313995
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{{_L},le="0.3"}} 0.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="0.5"}} 2.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="0.8"}} 9.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="1.0"}} 30.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="1.5"}} 80.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="2.0"}} 140.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="2.5"}} 201.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="5.0"}} 320.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="10.0"}} 326.0
vllm:e2e_request_latency_seconds_bucket{{{_L},le="+Inf"}} 326.0
vllm:e2e_request_latency_seconds_count{{{_L}}} 326.0
vllm:e2e_request_latency_seconds_sum{{{_L}}} 851.2204117774963
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27264",prefix_caching_hash_algo="builtin"}} 1.0
"""

# vLLM V1 with data parallelism (two engine cores behind one API server): one label set per engine.
VLLM_DP2 = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{VLLM_MODEL}"}} 5.0
vllm:num_requests_running{{engine="1",model_name="{VLLM_MODEL}"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{VLLM_MODEL}"}} 1.0
vllm:num_requests_waiting{{engine="1",model_name="{VLLM_MODEL}"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{VLLM_MODEL}"}} 0.5
vllm:kv_cache_usage_perc{{engine="1",model_name="{VLLM_MODEL}"}} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{VLLM_MODEL}"}} 600.0
vllm:prefix_cache_queries_total{{engine="1",model_name="{VLLM_MODEL}"}} 400.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="{VLLM_MODEL}"}} 300.0
vllm:prefix_cache_hits_total{{engine="1",model_name="{VLLM_MODEL}"}} 100.0
"""

# vLLM V0 (0.6.x): model_name only, gpu_cache_usage_perc and a prefix hit-rate gauge, no counters.
VLLM_V0 = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 4.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 11.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.9823
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="llama-2-7b"} 0.125
"""

SGLANG_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_S = f'engine_type="unified",model_name="{SGLANG_MODEL}",pp_rank="0",tp_rank="0"'
_T = f'model_name="{SGLANG_MODEL}"'

SGLANG = f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{_S}}} 23.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{{_S}}} 45281.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{_S}}} 0.28
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{_S}}} 1417.54
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{_S}}} 5.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{{_S}}} 0.007507552643049313
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{{_S}}} 161721.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{_T}}} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{{_T}}} 7.557572e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{{_T}}} 61026.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{{{_T}}} 2.3518979474117756e+06
sglang:time_to_first_token_seconds_bucket{{le="0.1",{_T}}} 0.0
sglang:time_to_first_token_seconds_bucket{{le="0.2",{_T}}} 12.0
sglang:time_to_first_token_seconds_bucket{{le="0.4",{_T}}} 301.0
sglang:time_to_first_token_seconds_bucket{{le="1.0",{_T}}} 2001.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf",{_T}}} 2010.0
sglang:time_to_first_token_seconds_count{{{_T}}} 2010.0
"""

# TGI router (metrics-exporter-prometheus): counters without `_total`, no labels on the load gauges.
TGI = """# HELP tgi_request_count Total number of requests
# TYPE tgi_request_count counter
tgi_request_count 1201
# TYPE tgi_request_success counter
tgi_request_success 1190
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 18342
# TYPE tgi_batch_inference_duration summary
tgi_batch_inference_duration{method="decode",quantile="0"} 0.018620042
tgi_batch_inference_duration{method="decode",quantile="0.5"} 0.02156491199063021
tgi_batch_inference_duration{method="decode",quantile="0.99"} 0.05372117700521496
tgi_batch_inference_duration_sum{method="decode"} 971.1946718070007
tgi_batch_inference_duration_count{method="decode"} 43716
# HELP tgi_request_duration Request duration
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 91
tgi_request_duration_bucket{le="1"} 530
tgi_request_duration_bucket{le="5"} 1180
tgi_request_duration_bucket{le="+Inf"} 1190
tgi_request_duration_sum 2301.91
tgi_request_duration_count 1190
"""

# llama.cpp server, current tools/server (server-task.cpp to_metrics): C++ stream number formatting,
# no KV-usage gauge, prompt_tokens_total excludes cached tokens.
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6000
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 2000
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 11.5893
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1.23457e+06
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 3544.27
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 90412
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 517.72
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 48.15
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 39
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 3.87
"""

# llama.cpp server, older examples/server: a KV-usage gauge, no cached-token counter.
LLAMACPP_OLD = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.849609
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 3480
# HELP llamacpp:requests_processing Number of request processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of request deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""
