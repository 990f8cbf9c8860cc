"""Span attribute names: OpenTelemetry's GenAI, HTTP and server semantic conventions (development
status, the registry as of semconv 1.37+), and the gateway's own under `llm_gateway.`.

GenAI names: `gen_ai.operation.name` (`chat`, `text_completion`, `embeddings`, or the endpoint's own
name), `gen_ai.provider.name` (the pool's engine flavour: `vllm`, `sglang`, `openai`, …),
`gen_ai.request.model`, `gen_ai.request.max_tokens`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`; `error.type` on failures. The opt-in
content attributes (`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`)
are never set.
"""

from __future__ import annotations

from gateway.api.request_parsing import Endpoint

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"

GATEWAY = "llm_gateway"
REQUEST_ID = f"{GATEWAY}.request_id"
TENANT = f"{GATEWAY}.tenant"
POOL = f"{GATEWAY}.pool"
PRIORITY = f"{GATEWAY}.priority"
STREAM = f"{GATEWAY}.stream"
OUTCOME = f"{GATEWAY}.outcome"
RETRIES = f"{GATEWAY}.retries"
CONTINUATIONS = f"{GATEWAY}.continuations"
QUEUE_DEPTH = f"{GATEWAY}.queue.depth_at_arrival"
QUEUE_WAIT_MS = f"{GATEWAY}.queue.wait_ms"
TTFT_MS = f"{GATEWAY}.ttft_ms"
REPLICA = f"{GATEWAY}.replica"
ATTEMPT = f"{GATEWAY}.attempt"
ATTEMPT_OUTCOME = f"{GATEWAY}.attempt.outcome"
ROUTE_POLICY = f"{GATEWAY}.route.policy"
ROUTE_BRANCH = f"{GATEWAY}.route.branch"
ROUTE_HOPS = f"{GATEWAY}.route.hops"
ROUTE_CANDIDATES = f"{GATEWAY}.route.candidates"
ROUTE_PREFIX_BLOCKS = f"{GATEWAY}.route.prefix_blocks"
"""Prompt blocks the chosen replica is expected to hold in its prefix cache (prefix policies)."""

_OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.TOKENIZE: "tokenize",
    Endpoint.DETOKENIZE: "detokenize",
}


def operation_name(endpoint: Endpoint) -> str:
    """`gen_ai.operation.name` of a proxied endpoint."""
    return _OPERATIONS.get(endpoint, endpoint.name.lower())
