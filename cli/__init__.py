"""The `llm-gateway` command (also `python -m cli`): serve, check-config, hash-key, demo, plan, bench,
mock-engine.

It sits above every other package — it imports `gateway`, `admission`, `capacity`, `bench` and
`mock_engine`, and none of them imports it — so no two packages import each other.
"""
