"""Optional deploy linters: a test that needs one skips with the pip package to install, unless
`LLM_GATEWAY_REQUIRE_DEPLOY_TOOLS=1` (CI) turns the missing tool into a failure."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "LLM_GATEWAY_REQUIRE_DEPLOY_TOOLS"


def _missing(what: str, package: str, how: str | None = None) -> None:
    message = f"{what} is not installed ({how or f'pip install {package}; it is in the dev extra'})"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_ENV}=1 requires it")
    pytest.skip(message)


def require_module(name: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        _missing(f"the Python module {name}", package)
        raise  # unreachable: skip/fail raise


def require_executable(name: str, package: str, how: str | None = None) -> str:
    """The path of `name` (beside the venv's python, or on PATH); `how` says how to install it when it
    is not a pip package."""
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if found is None:
        _missing(f"the {name} executable", package, how)
        raise AssertionError  # unreachable
    return found
