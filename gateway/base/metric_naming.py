"""How the gateway names its metrics: every name starts with `PREFIX` (`llm_gateway_…`), and labels
never carry request ids, prompts or session keys (only long-lived values: models, replicas, outcomes,
reasons, policies, tenants).
"""

PREFIX = "llm_gateway"
