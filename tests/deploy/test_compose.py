"""deploy/compose.yaml: valid against the Compose Specification schema (the copy check-jsonschema
vendors), three mock engines and Redis behind the gateway, and a gateway config that loads."""

from __future__ import annotations

import importlib.resources
import json
import re
from typing import Any

import yaml

from gateway.config.settings import parse_settings
from tests.deploy.tools import REPO, require_module

COMPOSE = REPO / "deploy" / "compose.yaml"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # resolves the x-* anchors and `<<` merges
    return data


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def test_compose_matches_the_compose_spec_schema() -> None:
    jsonschema = require_module("jsonschema", "kubernetes-validate")
    require_module("check_jsonschema", "check-jsonschema")
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(_compose())]
    assert not errors, "\n".join(errors)
    broken = _compose()
    broken["services"]["gateway"]["restartt"] = "always"
    assert list(validator.iter_errors(broken))


def test_three_mock_engines_redis_and_the_gateway() -> None:
    services = _compose()["services"]
    engines = {name: s for name, s in services.items() if s.get("command", [None])[0] == "mock-engine"}
    assert len(engines) == 3
    for service in engines.values():
        assert "--host" in service["command"] and service["command"][
            service["command"].index("--host") + 1
        ] == ("0.0.0.0")
    gateway = services["gateway"]
    assert gateway["command"] == ["serve"] and "8080:8080" in gateway["ports"]
    assert set(gateway["depends_on"]) == {*engines, "redis"}
    assert services["redis"]["image"].startswith("redis:")


def test_gateway_config_loads_and_points_at_the_services() -> None:
    gateway = _compose()["services"]["gateway"]
    source, _, target = gateway["volumes"][0].partition(":")
    assert target.removesuffix(":ro") == gateway["environment"]["LLM_GATEWAY_CONFIG"]
    settings = parse_settings(yaml.safe_load((COMPOSE.parent / source).read_text()))
    services = _compose()["services"]
    urls = settings.pools[0].replicas.static
    assert len(urls) == 3
    assert all(
        re.fullmatch(r"http://([\w-]+):8000", url) and url.split("//")[1].split(":")[0] in services
        for url in urls
    )
    assert settings.state.backend == "redis" and "//redis:" in settings.state.url
    assert _duration_s(gateway["stop_grace_period"]) > settings.server.drain_timeout_s + 5
